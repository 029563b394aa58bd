"""What periodic checkpoints cost a running job (issue 39): the stand-still and bytes
of each, and the share of run time lost at an interval, measured against the same work
without them.

Two 2-node jobs of disk-image VMs (tests/image_builder.py's image: Open MPI, sshd and
mpi_ring in it) run one after the other with hpcvm's ``local`` batch system in a
network namespace made here (a bridge of its own; nothing leaves it), in random order:
one started with ``cluster up --checkpoint-every EVERY --checkpoint-dir DIR`` (the
keeper saves the running job at that interval), one without. Each runs the same MPI
ring, ``--rounds`` rounds of ``--delay-ms``, timed from ``cluster exec --detach`` until
``cluster wait`` returns (the VMs stand still during each checkpoint, and so does the
ring). Prints:

- each periodic checkpoint's stand-still and bytes (the keeper's history), their mean
  with a 97% Student-t interval;
- the ring's wall time with and without, and the share lost, (with - without) /
  without, beside Young's first-order share C/tau from the measured stand-stills
  (one pair of runs: no interval; run it again for more);
- the interval that minimises lost work (Young's sqrt(2 C M) and Daly's) for a few
  mean times between failures, from the measured C.

Both rings' counters must be right in every round (no message lost or repeated across
the checkpoints). Run as root (the namespace); asserts nothing.

    .venv/bin/python benchmarks/periodic_checkpoints.py [--every 15s] [--rounds 450]
        [--delay-ms 200] [--memory 384M] [--dir /var/tmp] [--image PATH]
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
    hpcvm,
    interval,
    reexec_in_namespace,
)

from hpcvm.cluster.commands import keeper  # noqa: E402

NAMESPACE = "hpcvm-bench-periodic"
PREFIX = "10.88.0"
NAME = "bench-periodic"
ROUND = re.compile(r"^round=(\d+) counter=(\d+)", re.M)
MTBF_HOURS = (6.0, 24.0, 24.0 * 7)


def one_job(work: Path, args: argparse.Namespace, every: str | None) -> tuple[float, bool]:
    """Start the job (with the keeper when ``every``), run the ring, take it down: the
    ring's wall time and whether its counter was right in every round."""
    periodic = ["--checkpoint-every", every, "--checkpoint-dir", str(work / "series")]
    hpcvm("cluster", "up", "--batch", "local", "--nodes", "2", "--name", NAME,
          "--image", str(args.image), "--profile", "pinned", "--vcpus", "1",
          "--memory", args.memory, "--address", f"{PREFIX}.11/24", "--accel", "tcg",
          "--timeout", "900", *(periodic if every else []))  # fmt: skip
    try:
        begin = time.monotonic()
        hpcvm("cluster", "exec", "--detach", NAME, "--", "mpirun", "-np", "2", "--map-by",
              "node", "/usr/local/bin/mpi_ring", str(args.rounds), str(args.delay_ms))  # fmt: skip
        waited = hpcvm("cluster", "wait", NAME)
        seconds = time.monotonic() - begin
    finally:
        hpcvm("cluster", "down", NAME, check=False)
    counters = ROUND.findall(waited.stdout)
    intact = len(counters) == args.rounds and all(int(c) == 2 * int(r) for r, c in counters)
    return seconds, intact


def inside(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="hpcvm-bench-periodic-", dir=args.dir))
    try:
        order = ["with", "without"]
        random.shuffle(order)
        took: dict[str, tuple[float, bool]] = {}
        for side in order:
            took[side] = one_job(work, args, args.every if side == "with" else None)
            print(f"{side} periodic checkpoints: the ring took {took[side][0]:.1f} s", flush=True)
        history = [
            keeper.Taken.model_validate(json.loads(line))
            for line in (work / "series" / keeper.HISTORY).read_text().splitlines()
        ]
        report(args, took, history)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(
    args: argparse.Namespace, took: dict[str, tuple[float, bool]], history: list[keeper.Taken]
) -> None:
    saved = [t for t in history if t.ok]
    every = float(keeper_seconds(args.every))
    print()
    print(f"conditions: {conditions()}; 2 VMs of 1 vCPU, {args.memory}, pinned, TCG, local "
          f"batch; the ring {args.rounds} rounds of {args.delay_ms} ms")  # fmt: skip
    print(f"periodic checkpoints every {args.every}: {len(saved)} saved, "
          f"{len(history) - len(saved)} failed")  # fmt: skip
    if len(saved) < 2:
        print("fewer than 2 saved: no interval; give more --rounds")
        return
    stood = [t.paused_seconds or 0.0 for t in saved]
    print(f"  stand-still per checkpoint, s: {interval(stood)}")
    print(f"  bytes per checkpoint, MiB: {interval([(t.bytes or 0) / 2**20 for t in saved])}")
    print(f"  whole checkpoint (pause to running again), s: {interval([t.seconds for t in saved])}")
    with_s, without_s = took["with"][0], took["without"][0]
    mean_c = sum(stood) / len(stood)
    print(f"the ring: {with_s:.1f} s with, {without_s:.1f} s without: "
          f"{100 * (with_s - without_s) / without_s:.1f} % lost (one pair of runs); "
          f"Young's C/tau from the stand-stills: {100 * mean_c / every:.1f} %")  # fmt: skip
    for hours in MTBF_HOURS:
        mtbf = hours * 3600
        young = keeper.young_interval(mean_c, mtbf)
        lost = keeper.lost_fraction(young, mean_c, mtbf)
        print(f"  MTBF {hours:g} h: Young {young / 60:.1f} min, Daly "
              f"{keeper.daly_interval(mean_c, mtbf) / 60:.1f} min, lost at Young's "
              f"{100 * lost:.2f} %")  # fmt: skip
    right = all(ok for _s, ok in took.values())
    print(f"the MPI ring's counter: {'right in every round of both' if right else 'WRONG'}")


def keeper_seconds(text: str) -> float:
    from hpcvm.cli.common import parse_duration

    seconds = parse_duration(text, "--every")
    assert seconds is not None
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", default="15s")
    parser.add_argument("--rounds", type=int, default=450)
    parser.add_argument("--delay-ms", type=int, default=200)
    parser.add_argument("--memory", default="384M")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--image", type=Path, default=None)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
        return
    options = ["--every", args.every, "--rounds", str(args.rounds), "--delay-ms",
               str(args.delay_ms), "--memory", args.memory, "--dir", args.dir]  # fmt: skip
    reexec_in_namespace(__file__, NAMESPACE, f"{PREFIX}.1/24", options, args.image)


if __name__ == "__main__":
    main()
