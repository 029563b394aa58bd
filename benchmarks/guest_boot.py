"""Boot time of the built-in guest alone: QEMU start -> agent answers -> first exec.

Starts QEMU directly (TCG, 2 vCPUs, 1 GiB, /usr and /etc over 9p with the share table
on fw_cfg, the agent on virtio-serial), without the rest of hpcvm, so the guest's own
share of `hpcvm up` is visible. With ``--compare`` it alternates the uncompressed PVH
kernel and the packaged bzImage, run by run, so both see the same machine load. Prints
each run and the medians; asserts nothing (a benchmark, not a test).

    .venv/bin/python benchmarks/guest_boot.py [--runs 5] [--compare]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from hpcvm.bootspec import SHARE_TABLE_FWCFG
from hpcvm.guest import GuestImage, build_guest
from hpcvm.runtime.agent import GuestAgent


def argv(image: GuestImage, tmp: Path) -> list[str]:
    links = [p for p in ("/bin", "/sbin", "/lib", "/lib64") if os.path.islink(p)]
    table = "".join(f"link {os.readlink(p)} {p}\n" for p in links) + "ro t0 /usr\nro t1 /etc\n"
    shares: list[str] = []
    for index, path in enumerate(("/usr", "/etc")):
        fsdev = f"local,id=fs{index},path={path},security_model=none,readonly=on,multidevs=remap"
        shares += ["-fsdev", fsdev, "-device", f"virtio-9p-pci,fsdev=fs{index},mount_tag=t{index}"]
    return [
        "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max",
        "-m", "1G", "-smp", "2", "-nodefaults", "-display", "none", "-no-reboot",
        "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", image.cmdline,
        "-serial", f"file:{tmp / 'console.log'}",
        *shares, "-fw_cfg", f"name={SHARE_TABLE_FWCFG},string={table.replace(',', ',,')}",
        "-chardev", f"socket,id=qga,path={tmp / 'agent.sock'},server=on,wait=off",
        "-device", "virtio-serial-pci",
        "-device", f"virtserialport,chardev=qga,name={image.agent_port_name}",
    ]  # fmt: skip


def one_boot(image: GuestImage) -> tuple[float, float, float]:
    """(seconds to agent ready, to first exec answer, to QEMU exit after shutdown)."""
    with tempfile.TemporaryDirectory(prefix="hpcvm-bench-boot-") as tmp:
        begin = time.monotonic()
        proc = subprocess.Popen(argv(image, Path(tmp)), stdout=subprocess.DEVNULL)
        try:
            with GuestAgent(Path(tmp) / "agent.sock", timeout=60) as agent:
                agent.wait_ready(begin + 300, lambda: proc.poll() is None)
                ready = time.monotonic() - begin
                agent.exec(["true"])
                first = time.monotonic() - begin
                agent.shutdown()
            proc.wait(timeout=120)
            return ready, first, time.monotonic() - begin
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compare", action="store_true", help="PVH vmlinux vs bzImage")
    args = parser.parse_args()
    images = {"pvh": build_guest()}
    if args.compare:
        images["bzimage"] = build_guest(pvh=False)
    for name, image in images.items():
        print(f"{name}: {image.kernel} ({image.size_bytes / 2**20:.1f} MiB)")
    firsts: dict[str, list[float]] = {name: [] for name in images}
    for run in range(1, args.runs + 1):
        for name, image in images.items():
            load = Path("/proc/loadavg").read_text().split()[0]
            ready, first, gone = one_boot(image)
            firsts[name].append(first)
            print(
                f"run {run} {name:>7}: agent {ready:5.1f} s, first exec {first:5.1f} s, "
                f"QEMU gone {gone:5.1f} s (load {load})"
            )
    for name, values in firsts.items():
        print(f"median first exec, {name}: {statistics.median(values):.1f} s over {len(values)}")


if __name__ == "__main__":
    main()
