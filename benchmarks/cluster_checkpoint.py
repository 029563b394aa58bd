"""How long a whole job stands still for a checkpoint, and how fast it comes back, as
ratios against ``dd`` of the same bytes to the same directory (issue 26).

A 2-node job of disk-image VMs (tests/image_builder.py's image: Open MPI, sshd and
mpi_ring in it) is started with hpcvm's ``local`` batch system in a network namespace
made here (a bridge of its own; nothing leaves it), and the MPI ring runs across both
VMs for the whole benchmark (``cluster exec --detach``). Then:

- **pause-to-resume**, ``--reps`` times: ``cluster checkpoint --resume`` (every VM
  paused, then all saved, then all resumed: each phase one step on every node) against
  ``dd if=/dev/zero of=DIR/dd bs=4M count=N conv=fsync`` of the checkpoint's size, in
  random order within each repetition. The job's side is what the command reports: from
  the start of the pause step to the end of the resume step.
- **restore**, once at the end: ``cluster checkpoint`` (VMs taken down), then ``cluster
  up --restore`` timed from the command's start until every VM runs again, against
  ``dd`` reading the same bytes after the page cache of both was dropped.

At the end ``cluster wait`` collects the ring: its counter is right only if no message
was lost or repeated across every checkpoint. Prints the ratios per repetition, their
mean with a 97% Student-t interval, and the conditions. Run as root (the namespace);
asserts nothing.

    .venv/bin/python benchmarks/cluster_checkpoint.py [--reps 5] [--memory 512M]
        [--dir /var/tmp] [--image PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_common import (  # noqa: E402
    conditions,
    dd_read,
    dd_write,
    drop_cache,
    hpcvm,
    interval,
    reexec_in_namespace,
)

NAMESPACE = "hpcvm-bench-ckpt"
PREFIX = "10.89.0"
NAME = "bench-ckpt"
PAUSED = re.compile(r"\((\d+(?:\.\d+)?) MiB\); paused for (\d+(?:\.\d+)?) s")


def size_of(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def checkpoint_resume(target: Path) -> tuple[float, float, int]:
    """One ``cluster checkpoint --resume``: the pause-to-resume seconds it reports, the
    pause-to-saved seconds its manifest records, and its bytes (then removed)."""
    said = hpcvm("cluster", "checkpoint", NAME, str(target), "--resume").stderr
    found = PAUSED.search(said)
    if found is None:
        sys.exit(f"no pause time in: {said}")
    saved = float(json.loads((target / "job.json").read_text())["pause_seconds"])
    nbytes = size_of(target)
    shutil.rmtree(target)
    return float(found.group(2)), saved, nbytes


def pause_rep(work: Path, rep: int, nbytes: int) -> dict[str, float]:
    """The job's side and dd's, in random order."""
    sides: dict[str, float] = {}
    order = ["job", "dd"]
    random.shuffle(order)
    for side in order:
        if side == "job":
            sides["job"], sides["pause_to_saved"], size = checkpoint_resume(work / f"rep-{rep}")
            sides["bytes"] = float(size)
        else:
            sides["dd"] = dd_write(work / "dd", nbytes)
            (work / "dd").unlink()
    return sides


def restore_once(work: Path) -> dict[str, float]:
    target = work / "final"
    hpcvm("cluster", "checkpoint", NAME, str(target))
    nbytes = size_of(target)
    drop_cache(target)
    begin = time.monotonic()
    hpcvm("cluster", "up", "--batch", "local", "--nodes", "2", "--name", NAME,
          "--restore", str(target), "--timeout", "900")  # fmt: skip
    restore = time.monotonic() - begin
    dd_write(work / "dd", nbytes)
    dd = dd_read(work / "dd")
    (work / "dd").unlink()
    shutil.rmtree(target)
    return {"restore": restore, "dd": dd, "bytes": float(nbytes)}


def inside(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="hpcvm-bench-ckpt-", dir=args.dir))
    try:
        hpcvm("cluster", "up", "--batch", "local", "--nodes", "2", "--name", NAME,
              "--image", str(args.image), "--profile", "pinned", "--vcpus", "1",
              "--memory", args.memory, "--address", f"{PREFIX}.11/24", "--accel", "tcg",
              "--timeout", "900")  # fmt: skip
        rounds = 1_000_000
        hpcvm("cluster", "exec", "--detach", NAME, "--", "mpirun", "-np", "2", "--map-by",
              "node", "/usr/local/bin/mpi_ring", str(rounds), "200")  # fmt: skip
        time.sleep(3)
        _, _, nbytes = checkpoint_resume(work / "warm-up")  # sizes dd's side
        reps = []
        for rep in range(args.reps):
            sides = pause_rep(work, rep, nbytes)
            reps.append(sides)
            print(f"rep {rep}: job paused {sides['job']:.2f} s (pause to saved "
                  f"{sides['pause_to_saved']:.2f} s), dd of {nbytes / 2**20:.1f} MiB "
                  f"{sides['dd']:.2f} s: ratio {sides['job'] / sides['dd']:.2f}",
                  flush=True)  # fmt: skip
        final = restore_once(work)
        hpcvm("cluster", "exec", NAME, "--", "pkill", "-f", "mpi_ring", check=False)
        waited = hpcvm("cluster", "wait", NAME, check=False)
        counters = re.findall(r"^round=(\d+) counter=(\d+)", waited.stdout, re.M)
        intact = bool(counters) and all(int(c) == 2 * int(r) for r, c in counters)
        print()
        print(f"conditions: {conditions()}; 2 VMs of 1 vCPU, {args.memory}, TCG, local batch")
        ratios = [r["job"] / r["dd"] for r in reps]
        print(f"pause-to-resume / dd write, same bytes: {interval(ratios)}")
        print(f"  job paused {min(r['job'] for r in reps):.2f}-{max(r['job'] for r in reps):.2f} s"
              f" for {reps[0]['bytes'] / 2**20:.0f} MiB")  # fmt: skip
        print(f"restore (until every VM runs) / dd read, same bytes: "
              f"{final['restore'] / final['dd']:.2f} ({final['restore']:.2f} s against "
              f"{final['dd']:.2f} s for {final['bytes'] / 2**20:.0f} MiB, one restore)"
              )  # fmt: skip
        print(
            f"the MPI ring across {args.reps + 2} checkpoints and a restore: "
            f"{len(counters)} rounds, counter {'right' if intact else 'WRONG'} in every round"
        )
    finally:
        hpcvm("cluster", "down", NAME, check=False)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--memory", default="512M")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--image", type=Path, default=None)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
        return
    options = ["--reps", str(args.reps), "--memory", args.memory, "--dir", args.dir]
    reexec_in_namespace(__file__, NAMESPACE, f"{PREFIX}.1/24", options, args.image)


if __name__ == "__main__":
    main()
