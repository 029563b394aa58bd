"""Boot to first exec of the built-in guest: `hpcvm up` + `hpcvm exec` against QEMU
started bare with the very command line hpcvm starts.

The bare side is what hpcvm boots, not a hand-written stand-in: the script runs one
untimed `up` in this process with the QEMU backend's ``Popen`` recorded, so it has the
exact argv (machine type, devices, kernel, initrd, command line, share table, the
staging wrapper that assembles the one 9p export, ``-runas`` and the sandbox), then
takes the VM down. Each bare boot reruns that argv with its own run directory and
without ``-S`` (nothing to pin or resume), and times QEMU's start to the answer of a
first ``true`` run through the agent. The hpcvm side times the CLI as a user runs it:
`hpcvm up` from its start, then `hpcvm exec NAME -- true` until it returns (`down`
untimed). Sides alternate, the first of each round alternating too, so the machine's
load falls on both alike. ``--bare-initrd FILE`` adds a third side: the bare argv with
another initramfs (for instance a copy of an earlier image's, to weigh a change to it).

Prints each round, then per side the median and range, the ratio of medians, and the
median of the paired differences hpcvm - bare (hpcvm's own share), against the issue 29
goals (2.0 s to first exec under TCG; hpcvm's share 0.1 s), with the load average.
Writes nothing into the repository (run directories are made under /run and removed).
Needs root (the QEMU backend's staging and ``-runas``). A benchmark, not a test.

    .venv/bin/python benchmarks/guest_boot.py [--runs 7] [--profile naive] [--memory 512M]
        [--bare-initrd FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HPCVM = str(Path(sys.executable).with_name("hpcvm"))
GOAL_SECONDS = 2.0
GOAL_SHARE = 0.1
RECORD_NAME = f"bootrec{os.getpid()}"


def record_argv(profile: str, memory: str) -> tuple[list[str], str]:
    """The argv hpcvm's QEMU backend starts for this VM, and the run directory in it."""
    from hpcvm.plan.model import PlanRequest
    from hpcvm.runtime.backends import qemu_backend
    from hpcvm.runtime.hostside import paths
    from hpcvm.runtime.vm import lifecycle, stopping
    from hpcvm.units import parse_size

    seen: list[list[str]] = []
    real = subprocess.Popen

    class Recording(real):  # type: ignore[misc,valid-type]
        def __init__(self, args: list[str], *rest: object, **kw: object) -> None:
            if "qemu-system-x86_64" in args:
                seen.append(list(args))
            super().__init__(args, *rest, **kw)

    qemu_backend.subprocess.Popen = Recording  # type: ignore[misc]
    try:
        request = PlanRequest(
            profile=profile, vcpus=1, memory_bytes=parse_size(memory, what="--memory")
        )
        lifecycle.up(request, lifecycle.UpOptions(name=RECORD_NAME))
        stopping.down(RECORD_NAME)
    finally:
        qemu_backend.subprocess.Popen = real  # type: ignore[misc]
    return seen[0], str(paths.run_dir(RECORD_NAME))


def bare_argv(recorded: list[str], run_dir: str, tmp: Path, initrd: str | None) -> list[str]:
    argv = [a.replace(run_dir, str(tmp)) for a in recorded if a != "-S"]
    if initrd is not None:
        argv[argv.index("-initrd") + 1] = initrd
    return argv


def one_bare(recorded: list[str], run_dir: str, initrd: str | None) -> tuple[float, float]:
    """Seconds from starting QEMU to the agent's first answer and to the first exec's."""
    from hpcvm.runtime.channels.agent import GuestAgent

    tmp = Path(tempfile.mkdtemp(prefix="hpcvm-bare-", dir="/run"))
    tmp.chmod(0o755)
    (tmp / "stage").mkdir(mode=0o755)
    argv = bare_argv(recorded, run_dir, tmp, initrd)
    begin = time.monotonic()
    with open(tmp / "qemu.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        sock = tmp / "agent.sock"
        while not sock.exists():
            if proc.poll() is not None:
                raise SystemExit(f"bare QEMU exited: {(tmp / 'qemu.log').read_text()[-500:]}")
            time.sleep(0.002)
        with GuestAgent(sock, timeout=120.0) as agent:
            agent.wait_ready(begin + 300.0, lambda: proc.poll() is None)
            ready = time.monotonic() - begin
            agent.exec(["true"])
        return ready, time.monotonic() - begin
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        subprocess.run(["umount", "-l", str(tmp / "stage")], capture_output=True, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def one_hpcvm(name: str, shape: list[str]) -> tuple[float, float]:
    """Seconds from starting `hpcvm up` to its return, and to `hpcvm exec NAME -- true`
    returning."""
    begin = time.monotonic()
    up = subprocess.run([HPCVM, "up", "--name", name, *shape], capture_output=True, text=True)
    ready = time.monotonic() - begin
    try:
        if up.returncode != 0:
            raise SystemExit(f"hpcvm up failed ({up.returncode}): {up.stderr.strip()}")
        ran = subprocess.run([HPCVM, "exec", name, "--", "true"], capture_output=True, text=True)
        seconds = time.monotonic() - begin
        if ran.returncode != 0:
            raise SystemExit(f"hpcvm exec failed ({ran.returncode}): {ran.stderr.strip()}")
        return ready, seconds
    finally:
        subprocess.run([HPCVM, "down", name], capture_output=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--profile", default="naive")
    parser.add_argument("--memory", default="512M")
    parser.add_argument("--bare-initrd", help="a third side: bare with this initramfs")
    opts = parser.parse_args()
    shape = ["--profile", opts.profile, "--vcpus", "1", "--memory", opts.memory]
    recorded, run_dir = record_argv(opts.profile, opts.memory)  # also builds the guest
    machine = recorded[recorded.index("-machine") + 1]
    print(f"recorded: -machine {machine}, initrd {recorded[recorded.index('-initrd') + 1]}")
    sides = ["hpcvm", "bare"] + (["bare-initrd"] if opts.bare_initrd else [])
    times: dict[str, list[float]] = {side: [] for side in sides}
    readies: dict[str, list[float]] = {side: [] for side in sides}
    for i in range(opts.runs):
        load = Path("/proc/loadavg").read_text().split()[0]
        for side in sides if i % 2 == 0 else sides[::-1]:
            if side == "hpcvm":
                ready, seconds = one_hpcvm(f"bench-boot-{os.getpid()}-{i}", shape)
            else:
                initrd = opts.bare_initrd if side == "bare-initrd" else None
                ready, seconds = one_bare(recorded, run_dir, initrd)
            times[side].append(seconds)
            readies[side].append(ready)
            print(
                f"round {i + 1} {side:>11}: {ready:5.2f} s to ready (up returned / agent "
                f"answered), {seconds:5.2f} s to first exec (load {load})"
            )
    print()
    for side, values in times.items():
        print(
            f"{side:>11}: first exec median {statistics.median(values):.2f} s "
            f"[{min(values):.2f}-{max(values):.2f}], ready median "
            f"{statistics.median(readies[side]):.2f} s, over {len(values)}"
        )
    for label, got in (("first exec", times), ("ready", readies)):
        hpcvm, bare = statistics.median(got["hpcvm"]), statistics.median(got["bare"])
        share = statistics.median(h - b for h, b in zip(got["hpcvm"], got["bare"], strict=True))
        print(f"{label}: ratio hpcvm/bare {hpcvm / bare:.3f}; hpcvm's share (median paired "
              f"difference) {share:.2f} s (goal {GOAL_SHARE} s); hpcvm {hpcvm:.2f} s, bare "
              f"{bare:.2f} s (goal {GOAL_SECONDS} s to first exec)")  # fmt: skip
    print(f"({' '.join(shape)}, -machine {machine})")
    if opts.bare_initrd:
        bare, other = statistics.median(times["bare"]), statistics.median(times["bare-initrd"])
        print(f"first exec: ratio bare/bare-initrd {bare / other:.3f} (this image's initramfs "
              f"against {opts.bare_initrd})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
