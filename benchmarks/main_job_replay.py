"""How long a recorded main job would take with cheaper VM samples: the real loop,
replayed.

The README's first command spends its time in samples whose figures and costs are in
its results database. This script runs the real measurement loop (``bench.runner``:
interleaving, warm-ups, fills, the stopping rule, the time cap) on that record instead
of on the machine: every sample prints (through a real ``/bin/sh``, as in the runner's
unit tests) the next figures its cell recorded, in the order they were taken (drawn
again at random, seeded, once a cell needs more than were recorded), and advances a
clock by what a sample of that cell cost in the recorded run (from one sample's start
to the next one's: the benchmark and everything around it). ``--saved S`` takes S
seconds off every VM sample (warm-ups included): what a cheaper sample path saves.

Printed: the replayed wall time (the recorded time to the first sample and after the
last one, plus the replayed measuring), each cell's repetitions and stop, and each
native metric's relative half-width. The same seed gives the same interleaving as the
recorded run. A replay shows what the loop does with those costs; the machine's own
variation (a busy run, a slower native cell) is not in it.

    .venv/bin/python benchmarks/main_job_replay.py RESULTS_DIR [--saved 1.06] [--max-time 240]
        [--overrun-cap]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from itertools import count
from pathlib import Path
from typing import Any

from hpcvm.bench.core.metrics import Metric, MetricValue
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.runner import Runner
from hpcvm.bench.run.stopping import Stopping
from hpcvm.bench.suites.registry import kind_of
from hpcvm.stats import summarize
from hpcvm.store import SampleRecord, Store


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Recorded:
    """A suite whose samples replay a recorded cell: figures and cost (module doc)."""

    def __init__(
        self,
        name: str,
        metrics: tuple[Metric, ...],
        figures: dict[str, Iterator[dict[str, float]]],
        costs: dict[tuple[str, bool], float],
        clock: Clock,
    ) -> None:
        self.name = name
        self.metrics = metrics
        self.uses_np = name == "hpcc"
        self.output_files: tuple[str, ...] = ()
        self.figures = figures
        self.costs = costs
        self.clock = clock

    def validate(self, np_values: Sequence[int]) -> None:
        return None

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        env = {"native": "native", "vm-naive": "vm:naive", "vm-hpc": "vm:hpc"}.get(
            workdir.parent.name, workdir.parent.name
        )
        warmup = workdir.name.endswith("-warmup")
        self.clock.now += self.costs[(env, warmup)]
        values = next(self.figures[env])
        return ["/bin/sh", "-c", "echo " + " ".join(f"{k}={v!r}" for k, v in values.items())]

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        fields = dict(token.split("=", 1) for token in stdout.split())
        return [m.value(float(fields[m.name])) for m in self.metrics if m.name in fields]


def _figures(samples: list[SampleRecord], seed: int) -> Iterator[dict[str, float]]:
    taken = [{m.metric: m.value for m in s.metrics if m.value is not None} for s in samples]
    yield from taken
    rng = random.Random(seed)
    for _ in count():
        yield rng.choice(taken)


def _costs(samples: list[SampleRecord], end: float) -> dict[int, float]:
    """Each sample's id -> seconds from its start to the next sample's (the last one:
    to the end of the run)."""
    ordered = sorted(samples, key=lambda s: s.started_at)
    nexts = [s.started_at for s in ordered[1:]] + [end]
    return {s.id: nxt - s.started_at for s, nxt in zip(ordered, nexts, strict=True)}


def replay(out: Path, saved: float, max_time: float | None, tmp: Path) -> tuple[float, Runner, Any]:
    with Store.open(out) as store:
        run = store.run()
        samples = store.samples(run.id)
        config = BenchConfig.model_validate(run.args["config"])
    first = min(s.started_at for s in samples)
    last = max(samples, key=lambda s: s.started_at)
    end_of_last = last.started_at + (last.host_seconds or 0.0) + 1.0
    cost_of = _costs(samples, end_of_last)
    assert run.finished_at is not None
    outside = (first - run.started_at) + (run.finished_at - end_of_last)
    clock = Clock()
    suites = []
    for name in config.suites:
        kind = kind_of(name)
        assert kind is not None
        mine = [s for s in samples if s.suite == name]
        figures = {
            env: _figures([s for s in mine if s.env == env and not s.warmup and s.ok], 7)
            for env in config.envs
        }
        costs: dict[tuple[str, bool], float] = {}
        for env in config.envs:
            for warmup in (False, True):
                taken = [cost_of[s.id] for s in mine if s.env == env and s.warmup == warmup]
                less = saved if env != "native" else 0.0
                costs[(env, warmup)] = max(statistics.fmean(taken) - less, 0.01)
        suites.append(Recorded(name, kind.metrics, figures, costs, clock))
    replayed = config.model_copy(update={"max_time": max_time, "seed": run.seed})
    store = Store.open(tmp, create=True)
    run_id = store.create_run(args={}, seed=run.seed, confidence=config.confidence)
    envs: dict[str, NativeEnvironment] = {}
    for name in config.envs:
        stand_in = NativeEnvironment()  # runs the replayed figures' echo, nothing more
        stand_in.name = name
        envs[name] = stand_in
        store.add_environment(run_id, stand_in.describe())
    runner = Runner(
        store=store,
        run_id=run_id,
        seed=run.seed,
        config=replayed,
        envs=envs,
        suites=suites,
        out_dir=tmp,
        sizing_memory=1 << 30,
        clock=clock,
    )
    outcome = runner.run()
    return outside + store.run(run_id).elapsed_s, runner, outcome


def _native_widths(runner: Runner) -> str:
    parts = []
    for key, values in sorted(runner.values_by_metric().items()):
        if not key.startswith("native ") or len(values) < 2:
            continue
        s = summarize(values, 0.97)
        rel = (s.half_width or 0.0) / abs(s.mean) if s.mean else float("inf")
        parts.append((rel, key.split()[-1]))
    widest = sorted(parts, reverse=True)[:3]
    return ", ".join(f"{m} {r * 100:.1f}%" for r, m in widest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--saved", type=float, default=0.0, help="seconds off each VM sample")
    parser.add_argument("--max-time", type=float, default=None, help="default: the run's")
    parser.add_argument(
        "--overrun-cap",
        action="store_true",
        help="start samples past the cap as the loop did before e1e036f",
    )
    args = parser.parse_args()
    if args.overrun_cap:
        Stopping.stopped_before_cap = lambda self, key: False  # type: ignore[method-assign]
    with Store.open(args.results) as store:
        recorded = BenchConfig.model_validate(store.run().args["config"])
    cap = args.max_time if args.max_time is not None else recorded.max_time
    with tempfile.TemporaryDirectory(prefix="hpcvm-replay-") as tmp:
        wall, runner, outcome = replay(args.results, args.saved, cap, Path(tmp))
        runner.store.close()
    print(f"replayed wall time {wall:.0f} s (VM samples {args.saved:g} s cheaper, cap {cap} s)")
    print(f"stopped by {outcome.stop_reason}: {outcome.detail}")
    print(f"native's widest judged and extreme metrics: {_native_widths(runner)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
