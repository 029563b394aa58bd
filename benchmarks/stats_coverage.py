"""How often does hpcvm's 97% overhead interval cover the true overhead?

Draws native and VM samples from populations with known distributions (normal;
log-normal; normal with rare outliers, in both environments or in the VM only), computes
the overhead interval for each simulated experiment and prints the fraction of
experiments whose interval holds its true value, for n = 5, 20, 50:

- fieller, bootstrap (the mean's overhead): the ratio of the population means.
- hodges-lehmann (the robust overhead, hpcvm.stats.robust): the median of VM/native for
  one run of each, computed by numerical integration (simulate.true_median_ratio).

Fieller and Hodges-Lehmann: 2,000 experiments per row (vectorised). Bootstrap (scipy
BCa): slow, one scipy call per experiment, so by default 1,000 experiments of 2,000
resamples each (not the 9,999 overhead() uses); its coverage is known to about ±0.006
(the printed SE).

Then two tables on the same populations: how often flag_outliers marks a clean run and
how often it catches a run twice as slow; and how often overhead_trust says the mean's
interval should not be trusted, overall and among the experiments whose Fieller
interval missed. The whole script takes a few minutes on a shared 2-core machine.
Seeded: reruns print the same tables.

    .venv/bin/python benchmarks/stats_coverage.py [--bootstrap-experiments N] [--no-bootstrap]
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from hpcvm.stats import flag_outliers, overhead, overhead_trust
from hpcvm.stats.simulate import (
    Coverage,
    Population,
    bootstrap_coverage,
    fieller_coverage,
    robust_coverage,
)

SCENARIOS: dict[str, tuple[Population, Population]] = {
    "normal (CV 5% / 8%)": (
        Population(kind="normal", base=100.0, cv=0.05),
        Population(kind="normal", base=110.0, cv=0.08),
    ),
    "log-normal (CV 10% / 30%)": (
        Population(kind="lognormal", base=100.0, cv=0.10),
        Population(kind="lognormal", base=110.0, cv=0.30),
    ),
    "outliers both (2% of runs x2)": (
        Population(kind="outliers", base=100.0, cv=0.02, outlier_prob=0.02, outlier_factor=2.0),
        Population(kind="outliers", base=110.0, cv=0.03, outlier_prob=0.02, outlier_factor=2.0),
    ),
    "outliers VM only (2% x2)": (
        Population(kind="normal", base=100.0, cv=0.02),
        Population(kind="outliers", base=110.0, cv=0.03, outlier_prob=0.02, outlier_factor=2.0),
    ),
}
SIZES = (5, 20, 50)
FLAG_SIZES = (5, 10, 20, 50)
CONFIDENCE = 0.97
# Clean populations for the flag table, and the slow-run factor injected into them.
FLAG_POPULATIONS: dict[str, Population] = {
    "normal CV 2%": Population(kind="normal", base=100.0, cv=0.02),
    "normal CV 8%": Population(kind="normal", base=100.0, cv=0.08),
    "log-normal CV 10%": Population(kind="lognormal", base=100.0, cv=0.10),
    "log-normal CV 30%": Population(kind="lognormal", base=100.0, cv=0.30),
}
SLOW_FACTOR = 2.0


def _row(name: str, c: Coverage, seconds: float) -> str:
    se = math.sqrt(c.coverage * (1 - c.coverage) / c.experiments)
    verdict = "ok" if c.coverage >= 0.96 else ("low" if c.coverage >= 0.93 else "FAILS")
    return (
        f"{name:32} {c.method:14} {c.n:3d} {c.experiments:6d} {c.coverage:8.4f} ±{se:.4f} "
        f"{c.unbounded:5d} {c.true_ratio:7.4f} {c.median_relative_width:8.4f} {seconds:6.1f}s  "
        f"{verdict}"
    )


def _timed(
    name: str,
    method: Callable[..., Coverage],
    native: Population,
    vm: Population,
    experiments: int,
    n: int,
    seed: int,
) -> None:
    t0 = time.perf_counter()
    c = method(native, vm, n=n, experiments=experiments, confidence=CONFIDENCE, seed=seed)
    print(_row(name, c, time.perf_counter() - t0), flush=True)


def coverage_table(args: argparse.Namespace) -> None:
    print(f"97% overhead interval coverage (ok >= 0.96; low >= 0.93), seed {args.seed}")
    print(
        f"{'population (native / VM)':32} {'method':14} {'n':>3} {'exps':>6} {'coverage':>8} "
        f"{'SE':>7} {'unbnd':>5} {'truth':>7} {'med.width':>8} {'time':>7}"
    )
    for i, (name, (native, vm)) in enumerate(SCENARIOS.items()):
        for n in SIZES:
            seed = args.seed + 100 * i + n
            _timed(name, fieller_coverage, native, vm, args.experiments, n, seed)
            _timed(name, robust_coverage, native, vm, args.experiments, n, seed)
            if not args.no_bootstrap:
                boot = functools.partial(bootstrap_coverage, n_resamples=args.resamples)
                _timed(name, boot, native, vm, args.bootstrap_experiments, n, seed)
    print(
        "truth: the true value the method estimates (ratio of means; median pairwise ratio "
        "for hodges-lehmann); med.width: median interval width / truth; unbnd: experiments "
        "with no finite interval (counted as not covering)."
    )


def flag_table(experiments: int, seed: int) -> None:
    print(
        f"\nflag_outliers on {experiments} samples per row: 'clean' = fraction of clean "
        f"samples with any run flagged; 'caught' = fraction of runs made {SLOW_FACTOR:g}x "
        "slower (one per sample, the rest clean) that are flagged; 'false' = fraction of "
        "those samples with a clean run flagged too"
    )
    print(f"{'population':20} {'n':>3} {'clean':>7} {'caught':>7} {'false':>7}")
    for i, (name, pop) in enumerate(FLAG_POPULATIONS.items()):
        for n in FLAG_SIZES:
            rng = np.random.default_rng(seed + 10 * i + n)
            clean = pop.draw(rng, (experiments, n))
            any_clean = sum(any(flag_outliers(row)) for row in clean)
            slow = pop.draw(rng, (experiments, n))
            slow[:, 0] *= SLOW_FACTOR
            flags = np.array([flag_outliers(row) for row in slow])
            caught = float(flags[:, 0].mean())
            false = float(flags[:, 1:].any(axis=1).mean())
            print(f"{name:20} {n:3d} {any_clean / experiments:7.4f} {caught:7.4f} {false:7.4f}")


def trust_table(experiments: int, seed: int) -> None:
    print(
        f"\noverhead_trust on the Fieller overhead, {experiments} experiments per row: "
        "'warns' = fraction of experiments where the verdict says not to trust the "
        "mean's interval; 'missed' = fraction where Fieller missed the true ratio of "
        "means; 'warned|missed' = fraction of those misses that the verdict warned about"
    )
    print(
        f"{'population (native / VM)':32} {'n':>3} {'warns':>7} {'missed':>7} "
        f"{'warned|missed':>13}  kinds"
    )
    for i, (name, (native, vm)) in enumerate(SCENARIOS.items()):
        truth = vm.true_mean / native.true_mean
        for n in SIZES:
            rng = np.random.default_rng(seed + 100 * i + n)
            nat, v = native.draw(rng, (experiments, n)), vm.draw(rng, (experiments, n))
            warns = missed = warned_missed = 0
            kinds: Counter[str] = Counter()
            for a, b in zip(nat, v, strict=True):
                o = overhead(a, b, higher_is_better=False, confidence=CONFIDENCE)
                t = overhead_trust(a, b, o)
                low, high = o.ratio_ci_low, o.ratio_ci_high
                miss = low is None or high is None or not low <= truth <= high
                warns += not t.trusted
                missed += miss
                warned_missed += miss and not t.trusted
                kinds.update(set(t.kinds))
            share = f"{warned_missed / missed:13.3f}" if missed else f"{'-':>13}"
            kind_text = ", ".join(f"{k} {c / experiments:.3f}" for k, c in sorted(kinds.items()))
            print(
                f"{name:32} {n:3d} {warns / experiments:7.4f} {missed / experiments:7.4f} "
                f"{share}  {kind_text}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=2000, help="Fieller/robust experiments")
    ap.add_argument("--bootstrap-experiments", type=int, default=1000)
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    ap.add_argument("--no-bootstrap", action="store_true")
    ap.add_argument("--flag-experiments", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=2024)
    args = ap.parse_args()
    t0 = time.perf_counter()
    coverage_table(args)
    flag_table(args.flag_experiments, args.seed)
    trust_table(args.flag_experiments, args.seed)
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
