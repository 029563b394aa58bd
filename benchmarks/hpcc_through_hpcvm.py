"""Does measuring through hpcvm change what it measures? And what does `auto` save?

(1) Native HPC Challenge run through hpcvm's native environment (``NativeEnvironment.run``:
    clean environment, own session, /proc/interrupts read before and after, exactly
    what ``hpcvm bench`` does for each native sample) against the very same argv run
    bare (``subprocess.run``, the caller's environment). Runs alternate in ABBA order so
    slow drift of the machine falls on both equally. For each hpcc metric: both means,
    the overhead of "through hpcvm" against "bare" with its Fieller interval
    (hpcvm.stats.overhead, "bare" in the native role), and whether the point estimate
    and the whole interval lie within 1%.

(2) On the "through hpcvm" runs, in the order they were taken: how many repetitions
    the ``--reps auto`` rule (1% target, 97%) would have spent, and how many it needs to
    reach the interval width that a fixed 50 runs gave (stats.replay_auto).

This is a benchmark, not a test: the machine is shared, so figures vary between runs
of the script. Usage:

    .venv/bin/python benchmarks/hpcc_through_hpcvm.py [--runs 50] [--np 1] [--size small]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcvm.bench.hpcc import HpccSuite
from hpcvm.bench.metrics import MetricValue
from hpcvm.bench.native import NativeEnvironment
from hpcvm.stats import overhead, relative_half_width, replay_auto, summarize

TARGET = 0.01
CONFIDENCE = 0.97
FIXED = 50
TIMEOUT = 1800.0


def run_bare(suite: HpccSuite, workdir: Path, np_: int, memory: int) -> list[MetricValue]:
    argv = suite.prepare(workdir, np_, memory)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    return suite.parse(workdir, proc.stdout, proc.stderr, proc.returncode)


def run_through(
    env: NativeEnvironment, suite: HpccSuite, workdir: Path, np_: int, memory: int
) -> list[MetricValue]:
    argv = suite.prepare(workdir, np_, memory)
    out = env.run(argv, workdir, TIMEOUT, outputs=suite.output_files)
    return suite.parse(workdir, out.stdout, out.stderr, out.exit_code)


def collect(
    runs: int, np_: int, size: str
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, bool]]:
    suite = HpccSuite(size)  # type: ignore[arg-type]
    suite.validate([np_])
    env = NativeEnvironment()
    memory = env.memory_bytes
    bare: dict[str, list[float]] = {}
    through: dict[str, list[float]] = {}
    higher: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="hpcvm-bench-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        for i in range(runs):
            # ABBA: bare first in even pairs, through hpcvm first in odd ones.
            order = ("bare", "through") if i % 2 == 0 else ("through", "bare")
            for which in order:
                if which == "bare":
                    values = run_bare(suite, work / f"bare-{i}", np_, memory)
                else:
                    values = run_through(env, suite, work / f"through-{i}", np_, memory)
                sink = bare if which == "bare" else through
                for v in values:
                    if v.value is not None:
                        sink.setdefault(v.name, []).append(v.value)
                        higher[v.name] = v.metric.higher_is_better
            print(
                f"  pair {i + 1}/{runs} done ({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
            )
    return bare, through, higher


def report_overhead(
    bare: dict[str, list[float]], through: dict[str, list[float]], higher: dict[str, bool]
) -> None:
    print("(1) native hpcc through hpcvm vs the same argv run bare")
    head = f"{'metric':34} {'n':>3} {'bare mean':>12} {'hpcvm mean':>12} {'overhead':>9}  "
    print(head + f"{'interval (97%)':>22}  within 1%")
    for name in sorted(set(bare) & set(through)):
        b, t = bare[name], through[name]
        if len(b) < 2 or len(t) < 2:
            continue
        o = overhead(b, t, higher_is_better=higher[name], confidence=CONFIDENCE)
        if o.bounded:
            assert o.overhead_ci_low is not None and o.overhead_ci_high is not None
            interval = f"[{o.overhead_ci_low:+.2f}%, {o.overhead_ci_high:+.2f}%]"
            whole = o.overhead_ci_low >= -1.0 and o.overhead_ci_high <= 1.0
        else:
            interval, whole = "unbounded", False
        point = abs(o.overhead_pct) < 1.0
        verdict = "yes" if point and whole else ("point only" if point else "no")
        print(
            f"{name:34} {min(len(b), len(t)):>3} {summarize(b).mean:>12.5g} "
            f"{summarize(t).mean:>12.5g} {o.overhead_pct:>+8.2f}%  {interval:>22}  {verdict}"
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
    same = replay_auto(series, target=min(widths[worst], 0.99), confidence=CONFIDENCE)
    print(
        f"  fixed {fixed_n}: widest interval {worst} ±{widths[worst] * 100:.2f}%; auto reaches "
        f"that width for every metric after {same.decision.n} runs ({same.decision.reason})"
    )
    at_stop = same.relative_half_width_at_stop
    print(
        f"  widths when auto stopped there (vs at {fixed_n}): "
        + ", ".join(
            f"{k} ±{at_stop[k] * 100:.2f}% ({widths[k] * 100:.2f}%)"
            for k in sorted(at_stop, key=lambda k: -at_stop[k])[:3]
        )
    )
    print(
        "  note: with few runs a sample can look tight by chance; the rule's minimum of 3 "
        "runs is its only guard (METHOD.md), so an early stop is worth a second look"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=FIXED, help="pairs of runs (bare + hpcvm)")
    parser.add_argument("--np", type=int, default=1)
    parser.add_argument("--size", default="small", choices=["small", "medium"])
    args = parser.parse_args()
    bare, through, higher = collect(args.runs, args.np, args.size)
    report_overhead(bare, through, higher)
    report_reps(through)
    return 0


if __name__ == "__main__":
    sys.exit(main())
