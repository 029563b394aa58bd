"""Runs spent: the `--reps auto` rule against the reference studies' fixed 50 runs.

For benchmark metrics with a realistic run-to-run coefficient of variation (0.5%, 2%,
5%, and an hpcc-like set of several metrics judged together), simulate many sequences of
runs, replay the fixed-width rule (1% relative half-width at 97% confidence, at least 3
runs) on each, and compare the runs it spends and the interval it reports with what a
fixed 50 runs give. Seeded; prints one table.

With real samples (issue 4 wants this on real hpcc runs), pass a JSON file holding
{"metric": [value per run, in the order run], ...} or what
`benchmarks/hpcc_through_hpcvm.py --save` writes (``--arm`` picks the arm, default
``through``); `compare_real()` and `rules_on_real()` below compare the rule as it is,
the same rule aimed at fixed 50's widest width, and a per-metric rule, on the recorded
order and on random orders of the same runs:

    .venv/bin/python benchmarks/reps_auto_vs_fixed.py [--sequences N] [--samples FILE.json]
        [--arm through] [--orders 200]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from hpcvm.stats import relative_half_width, replay_auto, summarize

TARGET = 0.01
CONFIDENCE = 0.97
FIXED = 50
N_MAX = 2000  # cap for the simulation only: high enough that the target decides

SCENARIOS: dict[str, Sequence[float]] = {
    "CV 0.5%": [0.005],
    "CV 2%": [0.02],
    "CV 5%": [0.05],
    "hpcc-like: CV 0.5/1/2/5%": [0.005, 0.01, 0.02, 0.05],
}


def compare_real(
    samples_by_metric: Mapping[str, Sequence[float]],
    *,
    target: float = TARGET,
    confidence: float = CONFIDENCE,
    fixed: int = FIXED,
) -> dict[str, object]:
    """Replay `auto` on recorded runs and compare with the first `fixed` of them.

    Returns the runs auto spent, why it stopped, and the worst relative half-width over
    the metrics for auto and for the fixed count (NaN if fewer runs were recorded).
    """
    replay = replay_auto(samples_by_metric, target=target, confidence=confidence)
    n_fixed = min(fixed, replay.n_available)
    fixed_width = max(
        relative_half_width(v[:n_fixed], confidence) for v in samples_by_metric.values()
    )
    return {
        "auto_runs": replay.decision.n,
        "auto_reason": replay.decision.reason,
        "auto_worst_rel_half_width": max(replay.relative_half_width_at_stop.values()),
        "fixed_runs": n_fixed,
        "fixed_worst_rel_half_width": fixed_width if n_fixed == fixed else math.nan,
        "runs_recorded": replay.n_available,
    }


def _widths(runs: Mapping[str, npt.NDArray[np.float64]], n: int) -> dict[str, float]:
    return {k: relative_half_width(v[:n], CONFIDENCE) for k, v in runs.items()}


def _first_stop(
    runs: Mapping[str, npt.NDArray[np.float64]], wanted: Mapping[str, float], n_max: int
) -> int:
    """The first n >= 3 at which every metric's relative half-width is within its
    ``wanted`` width (n_max when none is)."""
    for n in range(3, n_max + 1):
        if all(relative_half_width(v[:n], CONFIDENCE) <= wanted[k] for k, v in runs.items()):
            return n
    return n_max


def _holds(values: npt.NDArray[np.float64], truth: float) -> bool:
    s = summarize(values, CONFIDENCE)
    return s.ci_low is not None and s.ci_high is not None and s.ci_low <= truth <= s.ci_high


def rules_on_real(
    samples_by_metric: Mapping[str, Sequence[float]], orders: int, seed: int
) -> dict[str, list[float]]:
    """The rules on real runs, each replayed on the recorded order and on ``orders``
    random orders of the same runs (the machine's drift then averages out). Per order:
    fixed 50's widths are the yardstick; the rules are

    - ``auto 1%``: the rule as it is, target 1%, capped at 50 (what `bench` does);
    - ``worst``: the same rule with the target set to fixed 50's widest width (the
      issue's comparison): its runs, and how many metrics are then wider than at 50;
    - ``per-metric``: each metric stops on its own fixed-50 width, the run when all
      have: its runs, and whether each interval at the stop holds the mean of all
      recorded runs (the best estimate of the truth there is), against fixed 50's.
    """
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in samples_by_metric.items()}
    total = min(len(v) for v in arrays.values())
    truth = {k: float(v[:total].mean()) for k, v in arrays.items()}
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {
        k: []
        for k in (
            "auto_n", "worst_n", "worst_wider", "metric_n", "metric_hold", "fixed_hold",
        )
    }  # fmt: skip
    for i in range(orders + 1):
        order = np.arange(total) if i == 0 else rng.permutation(total)
        runs = {k: v[:total][order] for k, v in arrays.items()}
        fixed = _widths(runs, FIXED)
        auto = replay_auto(runs, target=TARGET, confidence=CONFIDENCE, n_max=FIXED)
        out["auto_n"].append(auto.decision.n)
        worst_n = _first_stop(runs, dict.fromkeys(runs, max(fixed.values())), FIXED)
        out["worst_n"].append(worst_n)
        at_worst = _widths(runs, worst_n)
        out["worst_wider"].append(sum(at_worst[k] > fixed[k] for k in runs))
        metric_n = _first_stop(runs, fixed, FIXED)
        out["metric_n"].append(metric_n)
        for k, v in runs.items():
            out["metric_hold"].append(_holds(v[:metric_n], truth[k]))
            out["fixed_hold"].append(_holds(v[:FIXED], truth[k]))
    return out


def print_real(samples_by_metric: Mapping[str, Sequence[float]], orders: int, seed: int) -> None:
    total = min(len(v) for v in samples_by_metric.values())
    recorded = {k: np.asarray(v[:total], dtype=np.float64) for k, v in samples_by_metric.items()}
    print(
        f"{len(recorded)} metrics, {total} recorded runs; target {_pct(TARGET)}, "
        f"{CONFIDENCE:.0%}; fixed {FIXED}. Widths at {FIXED} runs in the recorded order:"
    )
    for k, w in sorted(_widths(recorded, FIXED).items(), key=lambda kw: -kw[1]):
        print(f"  {k:26} ±{_pct(w)}")
    r = rules_on_real(samples_by_metric, orders, seed)
    first = {k: v[0] for k, v in r.items() if not k.endswith("hold")}
    print(
        f"recorded order: auto 1% stops at {first['auto_n']:.0f}; worst-metric rule at "
        f"fixed {FIXED}'s widest width: {first['worst_n']:.0f} runs, "
        f"{first['worst_wider']:.0f} metrics then wider than at {FIXED}; per-metric rule: "
        f"{first['metric_n']:.0f} runs"
    )
    n = len(r["auto_n"])
    metric_n = np.asarray(r["metric_n"])
    print(
        f"over the recorded and {orders} random orders ({n} sequences), medians "
        f"[10th-90th percentile]:"
    )
    for label, key in (("auto 1%", "auto_n"), ("worst", "worst_n"), ("per-metric", "metric_n")):
        v = np.asarray(r[key])
        print(
            f"  {label:11} runs {np.median(v):4.0f} [{np.percentile(v, 10):.0f}-"
            f"{np.percentile(v, 90):.0f}], runs/{FIXED} {np.median(v) / FIXED:.2f}, "
            f"stops before {FIXED} in {np.mean(v < FIXED):.0%}"
        )
    print(
        f"  worst-metric rule: metrics wider than at {FIXED} when it stops: median "
        f"{np.median(r['worst_wider']):.0f} of {len(recorded)}"
    )
    print(
        f"  intervals holding the mean of all {total} runs: per-metric rule at its stop "
        f"{np.mean(r['metric_hold']):.3f}, fixed {FIXED} {np.mean(r['fixed_hold']):.3f} "
        f"(nominal {CONFIDENCE}); per-metric stops median {np.median(metric_n):.0f}"
    )


def _covers(values: npt.NDArray[np.float64]) -> bool:
    """Does the 97% interval of these runs hold the true mean (100)?"""
    s = summarize(values, CONFIDENCE)
    return s.ci_low is not None and s.ci_high is not None and s.ci_low <= 100.0 <= s.ci_high


def simulate(cvs: Sequence[float], sequences: int, seed: int) -> dict[str, list[float]]:
    """Per simulated sequence: auto's runs and worst width, fixed-50's worst width; and
    per metric whether each interval holds the true mean. Stopping when s happens to be
    small makes the auto interval too narrow at small n; the coverage columns show it."""
    rng = np.random.default_rng(seed)
    keys = ("auto_n", "auto_w", "fixed_w", "auto_cov", "fixed_cov")
    out: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(sequences):
        runs = {f"m{i}": rng.normal(100.0, 100.0 * cv, size=N_MAX) for i, cv in enumerate(cvs)}
        r = replay_auto(runs, target=TARGET, confidence=CONFIDENCE, n_max=N_MAX)
        out["auto_n"].append(r.decision.n)
        out["auto_w"].append(max(r.relative_half_width_at_stop.values()))
        out["fixed_w"].append(
            max(relative_half_width(v[:FIXED], CONFIDENCE) for v in runs.values())
        )
        for v in runs.values():
            out["auto_cov"].append(_covers(v[: r.decision.n]))
            out["fixed_cov"].append(_covers(v[:FIXED]))
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def print_table(sequences: int, seed: int) -> None:
    print(
        f"auto: stop when t*s/sqrt(n) <= {_pct(TARGET)} of the mean for every metric "
        f"({CONFIDENCE:.0%}, n >= 3); fixed: {FIXED} runs.\n{sequences} simulated sequences "
        f"per row (normal runs), seed {seed}; medians, [10th-90th percentile]."
    )
    print(
        f"{'metrics':26} {'auto runs':>14} {'auto width':>10} {'fixed width':>11} "
        f"{'runs auto/50':>12} {'width auto/50':>13} {'50 meets 1%':>11} "
        f"{'cover auto':>10} {'cover 50':>8}"
    )
    for i, (name, cvs) in enumerate(SCENARIOS.items()):
        s = simulate(cvs, sequences, seed + i)
        n = np.asarray(s["auto_n"])
        aw, fw = np.asarray(s["auto_w"]), np.asarray(s["fixed_w"])
        runs = f"{np.median(n):.0f} [{np.percentile(n, 10):.0f}-{np.percentile(n, 90):.0f}]"
        print(
            f"{name:26} {runs:>14} {_pct(float(np.median(aw))):>10} "
            f"{_pct(float(np.median(fw))):>11} {np.median(n) / FIXED:12.2f} "
            f"{np.median(aw) / np.median(fw):13.2f} {np.mean(fw <= TARGET):11.0%} "
            f"{np.mean(s['auto_cov']):10.3f} {np.mean(s['fixed_cov']):8.3f}"
        )
    print(
        "width: worst relative half-width over the metrics; '50 meets 1%': share of sequences\n"
        "where 50 fixed runs reach the target; cover: share of the metrics' 97% intervals\n"
        "that hold the true mean (nominal 0.97)."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--samples", type=Path, help="JSON {metric: [values in run order]}")
    ap.add_argument("--arm", default="through", help="with hpcc_through_hpcvm.py --save")
    ap.add_argument("--orders", type=int, default=200, help="random orders of real runs")
    args = ap.parse_args()
    if args.samples is not None:
        data = json.loads(args.samples.read_text())
        if args.arm in data:  # benchmarks/hpcc_through_hpcvm.py --save: one arm's runs
            data = data[args.arm]
        for key, value in compare_real(data).items():
            print(f"{key:28} {value}")
        print_real(data, args.orders, args.seed)
        return
    print_table(args.sequences, args.seed)


if __name__ == "__main__":
    main()
