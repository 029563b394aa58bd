"""Checkpoint and restore throughput of one disk-image VM against ``dd`` of the same
size to the same directory, as ratios (issue 26).

One VM is booted from the test image (tests/image_builder.py) and part of its RAM is
filled with random bytes in the guest's /dev/shm (a checkpoint of an idle guest is
mostly zero pages, which QEMU writes as a flag each: that would measure nothing). Then,
repetition by repetition, in random order within each pair:

- write: ``checkpoint.save`` of the paused VM (state, disk overlay and seed, the
  SHA-256 of each, fsynced, renamed into place; the VM resumes after) against
  ``dd if=/dev/zero of=DIR/dd bs=4M count=N conv=fsync`` of the checkpoint's size;
- read: ``checkpoint.restore`` of that checkpoint under another name (hash every
  file, re-plan, start QEMU, load the state, resume, until the agent answers; the
  restored VM is stopped afterwards) against ``dd if=DIR/dd of=/dev/null bs=4M``;
  beside it, untimed by the ratio, how long ``checkpoint.load`` (reading and hashing
  every file, the first step of a restore) takes alone, and of each save how long QEMU
  took to write the state (the rest: hashing, copying the disk, fsync, rename).
  Before each read both files are dropped from the page cache (posix_fadvise
  DONTNEED on those files only), so both sides read from the disk.

A first checkpoint and restore are made before the timed repetitions (sizing dd's
side and warming QEMU's binary and the image into the cache).

Throughput is the checkpoint's bytes over each side's seconds; the ratio hpcvm/dd is
per repetition, summarised by its mean and a Student-t interval (97%). Prints the
conditions (accelerator, CPU model, load average) with the numbers. Asserts nothing.

    .venv/bin/python benchmarks/checkpoint_throughput.py [--reps 5] [--memory 1G]
        [--fill 384M] [--dir /var/tmp] [--image PATH]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's benchmarks/, tests/

from benchmarks.bench_common import (
    conditions,
    dd_read,
    dd_write,
    default_image,
    drop_cache,
    image_vm_options,
)

from hpcvm.plan.model import PlanRequest
from hpcvm.runtime.checkpoint import save_restore as checkpoint
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine.options import UpOptions
from hpcvm.runtime.vm import guest_exec, inventory, lifecycle, stopping
from hpcvm.stats.summary import summarize
from hpcvm.units import parse_size


def save(name: str, target: Path) -> tuple[int, float, float]:
    """Pause, save, resume; (checkpoint bytes, seconds of the save alone, of which
    QEMU writing the state)."""
    from hpcvm.runtime.machine.state import load_machine

    machine = load_machine(name)
    checkpoint.pause(machine)
    try:
        begin = time.monotonic()
        saved = checkpoint.save(machine, target)
        seconds = time.monotonic() - begin
    finally:
        checkpoint.resume(machine)
    return sum(p.stat().st_size for p in target.iterdir()), seconds, saved.state_seconds


def checking(target: Path) -> float:
    """Seconds of the checks alone (every file read and hashed), from the disk."""
    drop_cache(target)
    begin = time.monotonic()
    checkpoint.load(target)
    return time.monotonic() - begin


def restore(target: Path, name: str) -> float:
    """Seconds from restore() to the restored guest's agent answering (then stopped)."""
    drop_cache(target)
    begin = time.monotonic()
    restored = checkpoint.restore(target, name=name, step_clock=False)
    seconds = time.monotonic() - begin
    stopping.stop(restored.machine, timeout=10.0)
    return seconds


def one_rep(name: str, work: Path, rep: int, dd_bytes: int) -> dict[str, float]:
    """Rates in bytes/s of one repetition, each pair's sides in random order."""
    target, dd_file = work / f"ck{rep}", work / "dd"
    rates: dict[str, float] = {}
    sides = ["hpcvm", "dd"]
    random.shuffle(sides)
    nbytes = 0
    for side in sides:
        if side == "dd":
            rates["dd_write"] = dd_bytes / dd_write(dd_file, dd_bytes)
        else:
            nbytes, seconds, rates["state_s"] = save(name, target)
            rates["checkpoint_s"] = seconds
            rates["checkpoint"] = nbytes / seconds
    random.shuffle(sides)
    for side in sides:
        if side == "dd":
            rates["dd_read"] = dd_bytes / dd_read(dd_file)
        else:
            rates["check_s"] = checking(target)  # untimed by the ratio: a breakdown
            rates["restore_s"] = restore(target, f"{name}-r{rep}")
            rates["restore"] = nbytes / rates["restore_s"]
    shutil.rmtree(target)
    dd_file.unlink()
    return rates


def boot(name: str, image: Path, memory: int, fill: int) -> None:
    request = PlanRequest(profile="pinned", vcpus=1, memory_bytes=memory, accel="tcg")
    machine = lifecycle.up(request, UpOptions(name=name, image=str(image)))
    result = guest_exec.exec_in(
        machine,
        ["sh", "-c", f"head -c {fill} /dev/urandom > /dev/shm/fill && sync"],
        timeout=600,
    )
    if result.exit_code != 0:
        raise SystemExit(f"filling the guest's RAM failed: {result.stderr.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    image_vm_options(parser)
    args = parser.parse_args()
    default_image(args)
    work = Path(tempfile.mkdtemp(prefix="hpcvm-ckpt-bench-", dir=args.dir))
    runtime = Path(tempfile.mkdtemp(prefix="hpcvm-ckpt-bench-rt-", dir="/tmp"))
    runtime.chmod(0o711)
    os.environ[paths.ENV_RUNTIME_DIR] = str(runtime / "rt")
    name = "ckbench"
    try:
        print(f"booting {args.image} ({args.memory}, filling {args.fill}) ...", flush=True)
        boot(name, args.image, parse_size(args.memory), parse_size(args.fill))
        warmup, _, _ = save(name, work / "warmup")  # sizes dd's side; not counted
        restore(work / "warmup", f"{name}-warmup")
        shutil.rmtree(work / "warmup")
        print(f"checkpoint size {warmup / 2**20:.1f} MiB; dd of the same size in {work}")
        print(f"conditions at start: {conditions()}")
        ratios: dict[str, list[float]] = {"write": [], "read": []}
        for rep in range(1, args.reps + 1):
            rates = one_rep(name, work, rep, warmup)
            ratios["write"].append(rates["checkpoint"] / rates["dd_write"])
            ratios["read"].append(rates["restore"] / rates["dd_read"])
            print(
                f"rep {rep}: checkpoint {rates['checkpoint'] / 2**20:6.1f} MiB/s, dd write "
                f"{rates['dd_write'] / 2**20:6.1f} MiB/s (x{ratios['write'][-1]:.2f}; save "
                f"{rates['checkpoint_s']:.1f} s, of which QEMU writing the state "
                f"{rates['state_s']:.1f} s); restore "
                f"{rates['restore'] / 2**20:6.1f} MiB/s, dd read "
                f"{rates['dd_read'] / 2**20:6.1f} MiB/s (x{ratios['read'][-1]:.2f}); restore "
                f"{rates['restore_s']:.1f} s, of which checking the files alone takes "
                f"{rates['check_s']:.1f} s",
                flush=True,
            )
        for label, values in ratios.items():
            s = summarize(values)
            interval = "" if s.ci_low is None else f" [{s.ci_low:.2f}, {s.ci_high:.2f}]"
            print(f"ratio hpcvm/dd {label}: mean {s.mean:.2f}{interval} "
                  f"({s.confidence:.0%} CI, n={s.n})")  # fmt: skip
        print(f"conditions at end: {conditions()}")
    finally:
        for vm in inventory.running_machines():
            stopping.stop(vm, timeout=10.0)
        inventory.list_vms()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    main()
