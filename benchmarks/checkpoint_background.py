"""A checkpoint that need not stop the VM: QEMU's background snapshot against the full
save hpcvm takes today, on one disk-image VM whose guest keeps writing memory (issue 39).

hpcvm saves a VM paused: it stops, QEMU writes every page, it runs again, so the stand
still is the whole write. QEMU (5.2 and later) can instead write a *background
snapshot* (``migrate-set-capabilities background-snapshot``): the VM stops only while
QEMU saves the devices and write-protects guest RAM (userfaultfd), then runs while QEMU
writes the pages; a page the guest writes before QEMU reached it is copied first. The
file holds the memory as it was at the start, as a paused save's does. Its price is
paid by the guest (a write fault per first write to a protected page) and not in a
stand-still. This script measures both, paired, on the same VM:

- **full**: ``stop``, migrate to a file (``fd:``, as hpcvm's checkpoint does), ``cont``;
  the stand-still is from ``stop`` to ``cont``;
- **background**: the capability on, migrate to a file while the VM runs; the
  stand-still is QEMU's own ``downtime`` of that migration (query-migrate).

QEMU runs as its own unprivileged user (hpcvm-qemu). A background snapshot needs
userfaultfd for faults the kernel takes on guest RAM, which Linux grants an unprivileged
process only with ``vm.unprivileged_userfaultfd=1`` (Debian's default is 0; QEMU 7.2
does not open /dev/userfaultfd, as later releases do): without it QEMU refuses the
capability, "Background-snapshot is not supported by host kernel", and the script says
so and stops. ``--unprivileged-userfaultfd`` sets the sysctl to 1 for the run and back
after (it lets every unprivileged process of the host handle its own page faults: a
wider attack surface, the reason for the default; measure, then decide).

Each state file is fsynced. The guest runs a loop that rewrites 32 MiB of its
/dev/shm per round and counts rounds; the rounds done during each save, against its
rate just before, say how much work the guest lost (a full save: all of it, for the
stand-still; a background one: what the write faults cost). Before the reps the guest's
RAM is filled with random bytes (an idle guest's pages are mostly zero, which QEMU
sends as a flag each). Modes alternate in random order within each pair.

Prints each pair, then per mode the mean and 97% Student-t interval of the stand-still,
the save's time and the guest's lost share, with the conditions (accelerator, CPU,
load). Under TCG (this machine) the numbers say how the two saves compare here, not
what they cost under KVM. Asserts nothing.

    .venv/bin/python benchmarks/checkpoint_background.py [--reps 5] [--memory 1G]
        [--fill 384M] [--dir /var/tmp] [--image PATH] [--unprivileged-userfaultfd]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's benchmarks/, tests/

from benchmarks.bench_common import conditions, default_image, image_vm_options, interval

from hpcvm.errors import RuntimeFailure
from hpcvm.plan.model import PlanRequest
from hpcvm.runtime.channels import qmp
from hpcvm.runtime.checkpoint.qemu_state import QemuStateSaver
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.machine.options import UpOptions
from hpcvm.runtime.machine.state import load_machine
from hpcvm.runtime.vm import guest_exec, inventory, lifecycle, stopping
from hpcvm.units import parse_size

USERFAULTFD = Path("/proc/sys/vm/unprivileged_userfaultfd")
LOOP = (
    "i=0; while :; do dd if=/dev/zero of=/dev/shm/dirty bs=1M count=32 conv=notrunc "
    "status=none; i=$((i+1)); echo $i > /dev/shm/rounds.new; mv /dev/shm/rounds.new "
    "/dev/shm/rounds; done"
)


def _sock(machine: Machine) -> str:
    assert machine.boot.qmp_socket
    return machine.boot.qmp_socket


def rounds(machine: Machine) -> tuple[float, int]:
    """(host time the guest read its counter, the counter): the guest loop's rounds."""
    result = guest_exec.exec_in(machine, ["cat", "/dev/shm/rounds"], timeout=60)
    if result.exit_code != 0:
        raise SystemExit(f"the guest's loop stopped: {result.stderr.strip()}")
    return time.monotonic(), int(result.stdout.strip())


def migrate_to(machine: Machine, path: Path) -> dict[str, Any]:
    """Save the VM's state to ``path`` as hpcvm's checkpoint does (QemuStateSaver: an
    ``fd:`` migration, polled to its end), fsynced; QEMU's final query-migrate."""
    QemuStateSaver().save(machine, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    status: dict[str, Any] = qmp.execute(_sock(machine), "query-migrate")
    return status


def background(machine: Machine, enabled: bool) -> None:
    caps = [{"capability": "background-snapshot", "state": enabled}]
    qmp.execute(_sock(machine), "migrate-set-capabilities", {"capabilities": caps})


def one_save(machine: Machine, mode: str, target: Path) -> dict[str, float]:
    """One save in ``mode`` and the guest's rounds around it."""
    sock = _sock(machine)
    t0, r0 = rounds(machine)
    time.sleep(2.0)
    t1, r1 = rounds(machine)  # the rate just before
    begin = time.monotonic()
    if mode == "full":
        qmp.execute(sock, "stop")
        status = migrate_to(machine, target)
        qmp.execute(sock, "cont")
        still = time.monotonic() - begin
    else:
        background(machine, True)
        try:
            status = migrate_to(machine, target)
        finally:
            background(machine, False)
        still = float(status.get("downtime", 0)) / 1000.0
    seconds = time.monotonic() - begin
    t2, r2 = rounds(machine)
    rate = (r1 - r0) / (t1 - t0)
    done, window = r2 - r1, t2 - t1
    lost = max(0.0, 1.0 - done / (rate * window)) if rate > 0 else float("nan")
    size = target.stat().st_size
    target.unlink()
    return {"still": still, "seconds": seconds, "bytes": size, "lost": lost, "rate": rate}


def boot(name: str, image: Path, memory: int, fill: int) -> Machine:
    request = PlanRequest(profile="pinned", vcpus=1, memory_bytes=memory, accel="tcg")
    lifecycle.up(request, UpOptions(name=name, image=str(image)))
    machine = load_machine(name)
    fill_cmd = f"head -c {fill} /dev/urandom > /dev/shm/fill && sync"
    for argv in (["sh", "-c", fill_cmd], ["sh", "-c", f"nohup sh -c '{LOOP}' >/dev/null 2>&1 &"]):
        result = guest_exec.exec_in(machine, argv, timeout=600)
        if result.exit_code != 0:
            raise SystemExit(f"preparing the guest failed: {result.stderr.strip()}")
    deadline = time.monotonic() + 60
    while guest_exec.exec_in(machine, ["test", "-f", "/dev/shm/rounds"], timeout=60).exit_code:
        if time.monotonic() > deadline:
            raise SystemExit("the guest's loop did not start")
        time.sleep(0.5)
    return machine


def report(results: dict[str, list[dict[str, float]]]) -> None:
    for mode, runs in results.items():
        still = [r["still"] for r in runs]
        secs = [r["seconds"] for r in runs]
        lost = [r["lost"] for r in runs]
        size = sum(r["bytes"] for r in runs) / len(runs) / 2**20
        print(
            f"{mode:10s}: stand-still {interval(still)} s, save {interval(secs)} s, guest "
            f"work lost during the save {interval(lost)} (share), {size:.0f} MiB, n={len(runs)}"
        )
    ratio = [
        b["still"] / f["still"] for f, b in zip(results["full"], results["background"], strict=True)
    ]
    print(f"stand-still background/full per pair: {interval(ratio, 3)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    image_vm_options(parser)
    parser.add_argument(
        "--unprivileged-userfaultfd",
        action="store_true",
        help="set vm.unprivileged_userfaultfd=1 for the run (restored after)",
    )
    args = parser.parse_args()
    default_image(args)
    if args.unprivileged_userfaultfd and os.geteuid() != 0:
        sys.exit("--unprivileged-userfaultfd sets a sysctl: run as root")
    was = USERFAULTFD.read_text().strip()
    if args.unprivileged_userfaultfd:
        USERFAULTFD.write_text("1\n")
    try:
        run(args)
    finally:
        if args.unprivileged_userfaultfd:
            USERFAULTFD.write_text(f"{was}\n")


def run(args: argparse.Namespace) -> None:
    print(f"vm.unprivileged_userfaultfd = {USERFAULTFD.read_text().strip()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="hpcvm-bg-bench-", dir=args.dir))
    runtime = Path(tempfile.mkdtemp(prefix="hpcvm-bg-bench-rt-", dir="/tmp"))
    runtime.chmod(0o711)
    os.environ[paths.ENV_RUNTIME_DIR] = str(runtime / "rt")
    try:
        print(f"booting {args.image} ({args.memory}, filling {args.fill}) ...", flush=True)
        machine = boot("bgbench", args.image, parse_size(args.memory), parse_size(args.fill))
        try:
            background(machine, True)
            background(machine, False)
        except RuntimeFailure as exc:
            why = f"no background snapshot here: {exc} (--unprivileged-userfaultfd)"
            raise SystemExit(why) from exc
        one_save(machine, "full", work / "warmup")  # QEMU's binary and the disk warm
        print(f"conditions at start: {conditions()}", flush=True)
        results: dict[str, list[dict[str, float]]] = {"full": [], "background": []}
        for rep in range(1, args.reps + 1):
            modes = ["full", "background"]
            random.shuffle(modes)
            for mode in modes:
                r = one_save(machine, mode, work / f"{mode}{rep}")
                results[mode].append(r)
                print(
                    f"rep {rep} {mode:10s}: stand-still {r['still']:.3f} s, save "
                    f"{r['seconds']:.2f} s, {r['bytes'] / 2**20:.0f} MiB, guest lost "
                    f"{r['lost']:.2f} of its work during the save ({r['rate']:.2f} rounds/s "
                    "before)",
                    flush=True,
                )
        report(results)
        print(f"conditions at end: {conditions()}")
    finally:
        for vm in inventory.running_machines():
            stopping.stop(vm, timeout=10.0)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    main()
