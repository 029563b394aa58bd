"""What one VM sample costs beyond its benchmark, before and after a change.

A VM environment's sample (``VmEnvironment.run``) sends the suite's input files into
the guest, reads interrupts and clocks around the benchmark, and brings the evidence and
the output files back. Everything but the benchmark itself is overhead: it lengthens
every bench run and counts against ``--max-time``. This script measures it as the wall
time of ``run`` minus the guest's own span of the benchmark (``guest_seconds``, taken
by the same wrapper on both sides), per sample, for two versions of the code.

Each side is a worker process (this script with ``--worker``) that imports one code:
a git ref's ``src`` exported into a temporary directory (``git archive``, which
writes nothing into the repository) for ``--before``, or the working tree's ``src``.
The workers run in that temporary directory, outside the repository: the guests see
the working directory, so the samples' directories lie there.
Each worker boots its own VM through that code (``vm:naive``, 1 vCPU, 512 MiB) and,
on each batch the parent asks for, resumes it, runs the batch and pauses it again, so
only one VM runs at a time. The parent alternates batches between the sides (the first
side of each round alternating too), so a change of the machine's load meets both
alike. The sample is shaped like an hpcc one: a 1.5 KB input file to send, a command
that runs 0.5 s in the guest and writes an 18 KB output file to fetch.

It prints, per side, the mean overhead per sample with its 97% Student-t interval and
the mean guest span (the same command on both sides), then the ratio after/before with
its 97% Fieller interval. A benchmark, not a test: it asserts nothing. Run it with
little else on the machine; the guests run under TCG here.

    .venv/bin/python benchmarks/vm_sample_overhead.py --before REF [--rounds 6] [--batch 5]

For issue 29 the 'before' was the commit before the completion port (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
INPUT_BYTES = 1500
OUTPUT_BYTES = 18_000
GUEST_SECONDS = 0.5
CONFIDENCE = 0.97


# -- worker (runs with one side's code first on sys.path) ---------------------------------


def worker(label: str, workdir: Path) -> int:
    """Boot a VM with this process's hpcvm, then serve batches: a line ``N`` runs N
    samples and answers one JSON line; ``quit`` (or end of input) takes the VM down."""
    from hpcvm.bench.envs.vm import VmEnvironment, plan_vm
    from hpcvm.units import MIB

    plan, _ = plan_vm("naive", vcpus=1, memory_bytes=512 * MIB)
    env = VmEnvironment(plan, vm_name=f"ovh{os.getpid()}-{label}")
    try:
        env.start()
        print(json.dumps({"ready": label}), flush=True)
        count = 0
        for line in sys.stdin:
            if line.strip() == "quit":
                break
            taken: list[dict[str, float | None]] = []
            env.activate()
            for _ in range(int(line)):
                count += 1
                taken.append(_one(env, workdir / f"s{count}"))
            env.deactivate()
            print(json.dumps(taken), flush=True)
    finally:
        env.close()
    return 0


def _one(env: Any, workdir: Path) -> dict[str, float | None]:
    import time

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "hpccinf.txt").write_text("x" * (INPUT_BYTES - 1) + "\n")
    script = f"sleep {GUEST_SECONDS}; head -c {OUTPUT_BYTES} /dev/zero | tr '\\0' y > hpccoutf.txt"
    argv = ["/usr/bin/env", "-C", str(workdir), "/bin/sh", "-c", script]
    begin = time.monotonic()
    out = env.run(argv, workdir, 120.0, outputs=("hpccoutf.txt",))
    wall = time.monotonic() - begin
    fetched = (workdir / "hpccoutf.txt").stat().st_size if out.exit_code == 0 else 0
    if out.exit_code != 0 or fetched != OUTPUT_BYTES:
        raise SystemExit(f"sample failed: exit {out.exit_code}, {fetched} bytes back")
    return {"wall": wall, "host": out.host_seconds, "guest": out.guest_seconds}


# -- parent ---------------------------------------------------------------------------------


class Side:
    """One worker process and what its batches returned."""

    def __init__(self, label: str, src: Path, workdir: Path) -> None:
        self.label = label
        env = dict(os.environ, PYTHONPATH=str(src), PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", label, "--workdir", str(workdir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=workdir.parent,  # outside the repository; the guest shares it
        )
        self.samples: list[dict[str, float]] = []
        ready = self._answer()
        if ready != {"ready": label}:
            raise SystemExit(f"{label}: worker did not start: {ready}")

    def _answer(self) -> Any:
        out: IO[str] | None = self.proc.stdout
        line = out.readline() if out is not None else ""
        if not line:
            raise SystemExit(f"{self.label}: worker exited ({self.proc.wait()})")
        return json.loads(line)

    def batch(self, n: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        self.samples += self._answer()

    def stop(self) -> None:
        if self.proc.stdin is not None and self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=300)

    def overheads(self) -> list[float]:
        return [s["wall"] - s["guest"] for s in self.samples if s.get("guest") is not None]


def _summary(label: str, side: Side) -> str:
    from hpcvm.stats import summarize

    over = summarize(side.overheads(), CONFIDENCE)
    guest = summarize([s["guest"] for s in side.samples if s.get("guest")], CONFIDENCE)
    half = over.half_width or 0.0
    return (
        f"{label:7} n={over.n:3}  overhead per sample {over.mean:.3f} s "
        f"[{over.mean - half:.3f}, {over.mean + half:.3f}]  guest span {guest.mean:.3f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="git ref of the 'before' code")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=5, help="samples per side and round")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.workdir)
    if not args.before:
        parser.error("--before REF is required")
    from hpcvm.stats.overhead import overhead

    # the guests see the worker's working directory: the temporary one, not the repository
    with tempfile.TemporaryDirectory(prefix="hpcvm-ovh-") as tmp:
        os.chmod(tmp, 0o755)  # QEMU runs as hpcvm-qemu: the guests must see into it
        tree = Path(tmp) / "before-tree"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", args.before, "src"],
            check=True,
            capture_output=True,
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        sides: list[Side] = []
        try:
            sides.append(Side("before", tree / "src", Path(tmp) / "before"))
            sides.append(Side("after", ROOT / "src", Path(tmp) / "after"))
            for r in range(args.rounds):
                for side in sides if r % 2 == 0 else sides[::-1]:
                    side.batch(args.batch)
                print(f"round {r + 1}/{args.rounds} done", flush=True)
        finally:
            for side in sides:
                side.stop()
    before, after = sides
    print()
    print(_summary("before", before))
    print(_summary("after", after))
    ratio = overhead(before.overheads(), after.overheads(), higher_is_better=False)
    low, high = ratio.ratio_ci_low, ratio.ratio_ci_high
    bounds = "unbounded" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"
    print(f"ratio after/before: {ratio.ratio:.3f} {bounds} (97% Fieller)")
    saved = sum(before.overheads()) / len(before.overheads()) - sum(after.overheads()) / len(
        after.overheads()
    )
    print(f"saved per VM sample: {saved:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
