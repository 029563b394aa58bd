"""Does measuring through hpcvm change what it measures? And what does `auto` save?

(1) Native HPC Challenge run through hpcvm's native environment (``NativeEnvironment.run``:
    clean environment, own session, /proc/interrupts read before and after, exactly
    what ``hpcvm bench`` does for each native sample) against the very same argv run
    bare (``subprocess.run``). To tell the harness from what it passes on, the arms
    (``--arms``) are taken in a rotating, reversing order every round so that drift of
    the machine falls on all alike:

    - ``bare``: the argv as the caller would run it, in the caller's environment and
      session;
    - ``clean``: the argv bare, but in hpcvm's clean environment (``env -i PATH=...``);
    - ``padded``: like ``clean`` plus one dummy variable as long as the caller's whole
      environment: the same bytes on the new process's stack, none of the content;
    - ``session``: like ``clean``, in a session of its own (``setsid``, as hpcvm starts
      every native run and every QEMU): with the kernel's autogroup scheduling a new
      session is a scheduling group of its own, so on a shared machine it gets a fair
      share against the caller's other work instead of sharing the caller's
      (docs/performance.md: this, not the environment, made runs through hpcvm faster);
    - ``through``: ``NativeEnvironment.run``.

    For each hpcc metric and each arm against the first: the overhead with its 97%
    interval from the paired log-ratios of the arms' runs in the same round (the design
    pairs them; drift of a shared machine cancels in a pair), and the unpaired Fieller
    interval of the ratio of means as well (hpcvm.stats.overhead), and whether the whole
    paired interval lies within 1%. ``through`` against ``session`` is the harness alone.

(2) On the ``through`` runs, in the order they were taken: how many repetitions
    the ``--reps auto`` rule (1% target, 97%) would have spent, and how many it needs to
    reach the interval width that a fixed 50 runs gave (stats.replay_auto).

``--save FILE`` writes every arm's values ({arm: {metric: [value per round]}}, JSON) for
benchmarks/reps_auto_vs_fixed.py. Nothing is written elsewhere (hpcc runs in a temporary
directory). This is a benchmark, not a test: the machine is shared, so figures vary
between runs of the script. Usage:

    .venv/bin/python benchmarks/hpcc_through_hpcvm.py [--runs 50] [--np 1] [--size small]
        [--arms bare,session,through] [--save /tmp/hpcc-samples.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hpcvm.bench.core.metrics import MetricValue
from hpcvm.bench.envs.environments import CLEAN_ENV
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.suites.hpcc.suite import HpccSuite
from hpcvm.stats import overhead, relative_half_width, replay_auto, summarize, t_quantile

TARGET = 0.01
CONFIDENCE = 0.97
FIXED = 50
TIMEOUT = 1800.0
ARMS = ("bare", "clean", "padded", "session", "through")
DEFAULT_ARMS = "bare,session,through"
PAD_VARIABLE = "HPCVM_PAD"

Runner = Callable[[list[str], Path], list[MetricValue]]


def _bare(suite: HpccSuite, prefix: Sequence[str], *, session: bool = False) -> Runner:
    def run(argv: list[str], workdir: Path) -> list[MetricValue]:
        proc = subprocess.run(
            [*prefix, *argv],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            start_new_session=session,
        )
        return suite.parse(workdir, proc.stdout, proc.stderr, proc.returncode)

    return run


def _through(suite: HpccSuite, env: NativeEnvironment) -> Runner:
    def run(argv: list[str], workdir: Path) -> list[MetricValue]:
        out = env.run(argv, workdir, TIMEOUT, outputs=suite.output_files)
        return suite.parse(workdir, out.stdout, out.stderr, out.exit_code)

    return run


def environment_bytes() -> int:
    """What the caller's environment occupies on a new process's stack."""
    return sum(len(k) + len(v) + 2 for k, v in os.environ.items())


def arms(suite: HpccSuite, env: NativeEnvironment) -> dict[str, Runner]:
    pad = f"{PAD_VARIABLE}=" + "x" * max(0, environment_bytes() - len(PAD_VARIABLE) - 2)
    return {
        "bare": _bare(suite, ()),
        "clean": _bare(suite, CLEAN_ENV),
        "padded": _bare(suite, (*CLEAN_ENV, pad)),
        "session": _bare(suite, CLEAN_ENV, session=True),
        "through": _through(suite, env),
    }


def order(round_: int, arms: Sequence[str]) -> list[str]:
    """Rotate the arms every round and reverse every other rotation: each arm takes
    each position equally often, before and after each other arm."""
    k = round_ % len(arms)
    rotated = list(arms[k:]) + list(arms[:k])
    return rotated[::-1] if (round_ // len(arms)) % 2 else rotated


def collect(
    runs: int, np_: int, size: str, chosen: Sequence[str]
) -> tuple[dict[str, dict[str, list[float]]], dict[str, bool]]:
    """Per arm, per metric, the value of each round (None-free: a round where any arm
    lost a metric drops that metric's round for all, so the arms stay paired)."""
    suite = HpccSuite(size)  # type: ignore[arg-type]
    suite.validate([np_])
    env = NativeEnvironment()
    memory = env.memory_bytes
    runners = arms(suite, env)
    values: dict[str, dict[str, list[float]]] = {arm: {} for arm in chosen}
    higher: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="hpcvm-bench-") as tmp:
        started = time.monotonic()
        for i in range(runs):
            got: dict[str, dict[str, float]] = {}
            for arm in order(i, chosen):
                workdir = Path(tmp) / f"{arm}-{i}"
                argv = suite.prepare(workdir, np_, memory)
                got[arm] = {}
                for v in runners[arm](argv, workdir):
                    if v.value is not None:
                        got[arm][v.name] = v.value
                        higher[v.name] = v.metric.higher_is_better
            for name in set.intersection(*(set(g) for g in got.values())):
                for arm in chosen:
                    values[arm].setdefault(name, []).append(got[arm][name])
            print(f"  round {i + 1}/{runs} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return values, higher


def paired(base: list[float], other: list[float], higher: bool) -> tuple[float, float, float]:
    """Overhead of ``other`` against ``base`` in % (positive: worse), with its interval,
    from the mean log-ratio of the paired runs (Student t)."""
    logs = [math.log(o / b) for b, o in zip(base, other, strict=True)]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(CONFIDENCE, n - 1) * sd / math.sqrt(n)
    sign = -1.0 if higher else 1.0  # higher is better: a smaller value is the overhead

    def pct(x: float) -> float:
        return (math.exp(sign * x) - 1.0) * 100.0

    low, high = sorted((pct(mean - half), pct(mean + half)))
    return pct(mean), low, high


def report_overhead(values: dict[str, dict[str, list[float]]], higher: dict[str, bool]) -> None:
    print(f"(1) native hpcc, each arm against another ({CONFIDENCE:.0%} intervals)")
    print(f"    caller's environment: {environment_bytes()} bytes")
    head = f"{'metric':24} {'n':>3} {'comparison':18} {'overhead':>9} {'paired interval':>20}"
    print(f"{head} {'Fieller interval':>20}  within 1%")
    within: dict[str, int] = {}
    pairs = [("bare", a) for a in values if a != "bare"] + [
        (b, a) for b, a in (("clean", "padded"), ("session", "through")) if {a, b} <= set(values)
    ]
    for base, arm in pairs:
        label = f"{arm} vs {base}"
        within[label] = 0
        for name in sorted(values[base]):
            b, t = values[base][name], values[arm][name]
            if len(b) < 3:
                continue
            point, low, high = paired(b, t, higher[name])
            o = overhead(b, t, higher_is_better=higher[name], confidence=CONFIDENCE)
            fieller = (
                f"[{o.overhead_ci_low:+.2f}%, {o.overhead_ci_high:+.2f}%]"
                if o.overhead_ci_low is not None and o.overhead_ci_high is not None
                else "unbounded"
            )
            ok = low >= -1.0 and high <= 1.0
            within[label] += ok
            print(
                f"{name:24} {len(b):>3} {label:18} {point:>+8.2f}% "
                f"{f'[{low:+.2f}%, {high:+.2f}%]':>20} {fieller:>20}  {'yes' if ok else 'no'}"
            )
    metrics = len(next(iter(values.values())))
    print(
        "    paired intervals within ±1%: "
        + ", ".join(f"{label} {count}/{metrics}" for label, count in within.items())
    )


def report_reps(through: dict[str, list[float]]) -> None:
    n = min(len(v) for v in through.values())
    series = {k: v[:n] for k, v in through.items()}
    print(f"\n(2) repetitions: auto against a fixed {FIXED} ({n} runs available)")
    auto = replay_auto(series, target=TARGET, confidence=CONFIDENCE)
    d = auto.decision
    print(
        f"  auto, target {TARGET:.0%}: stops after {d.n} runs ({d.reason}); widest interval "
        f"then {d.worst_metric} ±{d.worst_relative_half_width * 100:.2f}%"
    )
    fixed_n = min(FIXED, n)
    widths = {k: relative_half_width(v[:fixed_n], CONFIDENCE) for k, v in series.items()}
    worst = max(widths, key=lambda k: widths[k])
    print(
        f"  fixed {fixed_n}: widest interval {worst} ±{widths[worst] * 100:.2f}% "
        f"(means: {', '.join(f'{k} {summarize(v).mean:.4g}' for k, v in list(series.items())[:3])}"
        ", ...); benchmarks/reps_auto_vs_fixed.py --samples compares the rules"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=FIXED, help="rounds (one run of each arm)")
    parser.add_argument("--np", type=int, default=1)
    parser.add_argument("--size", default="small", choices=["small", "medium"])
    parser.add_argument("--save", type=Path, help="write the values as JSON to this file")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"from {', '.join(ARMS)}")
    args = parser.parse_args()
    chosen = [a for a in args.arms.split(",") if a]
    unknown = [a for a in chosen if a not in ARMS]
    if unknown or "bare" not in chosen or "through" not in chosen:
        parser.error(f"--arms: bare and through, and any of {', '.join(ARMS)}")
    values, higher = collect(args.runs, args.np, args.size, chosen)
    if args.save is not None:
        args.save.write_text(json.dumps({"higher_is_better": higher, **values}, indent=1))
    report_overhead(values, higher)
    report_reps(values["through"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
