"""What the benchmarks share: ``dd`` of the same bytes as the disk's own speed, the
conditions printed beside every number, a 97% Student-t interval of a list of ratios,
and a network namespace with a bridge of its own for the cluster benchmarks (hpcvm's
``local`` batch system in it; nothing leaves it)."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hpcvm.stats.summary import summarize

BLOCK = 4 * 1024 * 1024


def drop_cache(directory: Path) -> None:
    """Drop the page cache of every file under ``directory`` (and only those)."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def dd_write(path: Path, nbytes: int) -> float:
    count = -(-nbytes // BLOCK)
    begin = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={BLOCK}", f"count={count}",
                    "conv=fsync", "status=none"], check=True)  # fmt: skip
    return time.monotonic() - begin


def dd_read(path: Path) -> float:
    drop_cache(path.parent)
    begin = time.monotonic()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", f"bs={BLOCK}", "status=none"], check=True)
    return time.monotonic() - begin


def image_vm_options(parser: argparse.ArgumentParser) -> None:
    """The options of the benchmarks that fill a disk-image VM's RAM and save it
    (checkpoint_throughput, checkpoint_background): repetitions, the guest's memory and
    how much of it holds random bytes, the directory written to, the image (default: the
    test image, built once per machine by tests/image_builder.py)."""
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--memory", default="1G")
    parser.add_argument("--fill", default="384M", help="random bytes put in guest RAM")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--image", type=Path, default=None)


def default_image(args: argparse.Namespace) -> None:
    """``--image`` left out: the test image."""
    if args.image is None:
        from tests import image_builder

        args.image = image_builder.build_test_image()


def conditions() -> str:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), "?",
    )  # fmt: skip
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return f"TCG, {os.cpu_count()} CPUs ({cpu}), load average {load}"


def interval(values: list[float], digits: int = 2) -> str:
    """Mean and 97% Student-t interval, with n."""
    s = summarize(values, confidence=0.97)
    if s.ci_low is None or s.ci_high is None:
        return f"{s.mean:.{digits}f} (n={len(values)})"
    return f"{s.mean:.{digits}f} [{s.ci_low:.{digits}f}, {s.ci_high:.{digits}f}] (n={len(values)})"


HPCVM = str(Path(sys.executable).parent / "hpcvm")


def hpcvm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the hpcvm of this interpreter's environment; exit with its stderr on failure."""
    done = subprocess.run([HPCVM, *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        sys.exit(f"hpcvm {' '.join(args)} failed:\n{done.stderr}")
    return done


def require_root() -> None:
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark makes a network namespace with a bridge")


def run_in_namespace(namespace: str, bridge_address: str, argv: Sequence[str]) -> int:
    """Run ``argv`` in a new network namespace with loopback and a bridge ``br0`` at
    ``bridge_address`` (an IPv4 interface), removed afterwards; its exit code. Root."""
    require_root()
    steps = [["ip", "netns", "add", namespace], ["ip", "-n", namespace, "link", "set", "lo", "up"],
             ["ip", "-n", namespace, "link", "add", "br0", "type", "bridge"],
             ["ip", "-n", namespace, "addr", "add", bridge_address, "dev", "br0"],
             ["ip", "-n", namespace, "link", "set", "br0", "up"]]  # fmt: skip
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
    try:
        for step in steps:
            subprocess.run(step, check=True)
        return subprocess.run(["ip", "netns", "exec", namespace, *argv], check=False).returncode
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)


def reexec_in_namespace(
    script: str, namespace: str, bridge_address: str, options: list[str], image: Path | None
) -> int:
    """A cluster benchmark's outer half: as root, the test image built (unless given),
    then ``script --inside OPTIONS --image IMAGE`` run in its own network namespace."""
    require_root()
    if image is None:
        from tests import image_builder

        image = image_builder.build_test_image()
    argv = [sys.executable, script, "--inside", *options, "--image", str(image)]
    return run_in_namespace(namespace, bridge_address, argv)


def command_seconds(argv: list[str], env: dict[str, str], gap: float = 0.0) -> float:
    """Wall seconds of one run of ``argv`` (after ``gap`` seconds of rest): what a user
    waits for a command (benchmarks/exec_latency.py, command_latency.py)."""
    time.sleep(gap)
    begin = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, env=env)
    return time.perf_counter() - begin


def cpu_model() -> str:
    """The host CPU's model name, printed with the figures."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()
