"""Runs spent: the `--reps auto` rule against the reference studies' fixed 50 runs.

For benchmark metrics with a realistic run-to-run coefficient of variation (0.5%, 2%,
5%, and an hpcc-like set of several metrics judged together), simulate many sequences of
runs, replay the fixed-width rule (1% relative half-width at 97% confidence, at least 3
runs) on each, and compare the runs it spends and the interval it reports with what a
fixed 50 runs give. Seeded; prints one table.

With real samples (issue 4 wants this on real hpcc runs), pass a JSON file holding
{"metric": [value per run, in the order run], ...}; `compare_real()` below does the
same comparison on it:

    .venv/bin/python benchmarks/reps_auto_vs_fixed.py [--sequences N] [--samples FILE.json]
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
    args = ap.parse_args()
    if args.samples is not None:
        data = json.loads(args.samples.read_text())
        for key, value in compare_real(data).items():
            print(f"{key:28} {value}")
        return
    print_table(args.sequences, args.seed)


if __name__ == "__main__":
    main()
