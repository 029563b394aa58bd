"""Does the 97% Fieller interval cover the true overhead 97% of the time?

2,000 simulated experiments per case, native and VM samples drawn from populations whose
means are known in closed form (hpcvm.stats.simulate.Population, whose means are checked
against large samples below). Seeded, vectorised: well under a second.

Bounds: with 2,000 experiments the standard error of a 97% coverage is 0.0038, so a
correct interval lands in [0.96, 0.985] (about 3 SE either side; the seeds are fixed).
The upper bound catches an interval that is too wide (e.g. a wrong t), the lower one an
interval that is too narrow. Skewed data only get the looser ">= 0.93" floor.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcvm.stats import fieller_set
from hpcvm.stats.robust import hodges_lehmann_set
from hpcvm.stats.simulate import Population, fieller_coverage, robust_coverage, true_median_ratio

EXPERIMENTS = 2000
CONF = 0.97

NORMAL = (
    Population(kind="normal", base=100.0, cv=0.05),
    Population(kind="normal", base=110.0, cv=0.08),  # VM 10% slower and noisier
)
LOGNORMAL = (
    Population(kind="lognormal", base=100.0, cv=0.10),
    Population(kind="lognormal", base=110.0, cv=0.30),
)
OUTLIERS_BOTH = (  # 2% of runs twice as slow, in both environments
    Population(kind="outliers", base=100.0, cv=0.02, outlier_prob=0.02, outlier_factor=2.0),
    Population(kind="outliers", base=110.0, cv=0.03, outlier_prob=0.02, outlier_factor=2.0),
)
OUTLIERS_VM_ONLY = (  # native clean, 2% of VM runs twice as slow
    Population(kind="normal", base=100.0, cv=0.02),
    Population(kind="outliers", base=110.0, cv=0.03, outlier_prob=0.02, outlier_factor=2.0),
)


def _coverage(pops: tuple[Population, Population], n: int, seed: int) -> tuple[float, int]:
    """Count coverage here, independently of simulate.fieller_coverage's bookkeeping."""
    native, vm = pops
    rng = np.random.default_rng(seed)
    nat = native.draw(rng, (EXPERIMENTS, n))
    v = vm.draw(rng, (EXPERIMENTS, n))
    s = fieller_set(
        v.mean(axis=1),
        v.var(axis=1, ddof=1) / n,
        n,
        nat.mean(axis=1),
        nat.var(axis=1, ddof=1) / n,
        n,
        CONF,
    )
    truth = vm.true_mean / native.true_mean
    hits = 0
    for low, high, ok in zip(s.low, s.high, s.bounded, strict=True):
        hits += bool(ok) and low <= truth <= high
    return hits / EXPERIMENTS, int(np.count_nonzero(~s.bounded))


@pytest.mark.parametrize(
    "pop", [*NORMAL, *LOGNORMAL, *OUTLIERS_BOTH], ids=lambda p: f"{p.kind}-{p.base}-{p.cv}"
)
def test_population_means_are_what_the_simulation_assumes(pop: Population) -> None:
    rng = np.random.default_rng(99)
    draws = pop.draw(rng, (2_000_000,))
    se = draws.std() / np.sqrt(draws.size)
    assert abs(draws.mean() - pop.true_mean) < 5 * se
    if pop.kind != "outliers":  # outliers widen the spread on purpose
        assert draws.std() / draws.mean() == pytest.approx(pop.cv, rel=0.01)


@pytest.mark.parametrize("n", [5, 20, 50])
def test_normal_coverage_is_nominal(n: int) -> None:
    coverage, unbounded = _coverage(NORMAL, n, seed=1000 + n)
    print(f"normal n={n}: Fieller 97% coverage {coverage:.4f}")
    assert unbounded == 0
    assert 0.96 <= coverage <= 0.985


def test_lognormal_coverage() -> None:
    coverage, _ = _coverage(LOGNORMAL, 20, seed=2020)
    print(f"lognormal n=20: Fieller 97% coverage {coverage:.4f}")
    assert coverage >= 0.93


def test_outliers_in_both_coverage() -> None:
    coverage, _ = _coverage(OUTLIERS_BOTH, 20, seed=3030)
    print(f"outliers in both, n=20: Fieller 97% coverage {coverage:.4f}")
    assert coverage >= 0.93


@pytest.mark.xfail(
    strict=True,
    reason="known limit: rare large outliers in only one sample; 2 of 3 samples of 20 hold "
    "none, so the interval of the mean is narrow around the wrong value (coverage ~0.6)",
)
def test_outliers_in_vm_only_coverage() -> None:
    coverage, _ = _coverage(OUTLIERS_VM_ONLY, 20, seed=4040)
    print(f"outliers in VM only, n=20: Fieller 97% coverage {coverage:.4f}")
    assert coverage >= 0.93


ROBUST_EXPERIMENTS = 600


def _robust_coverage(pops: tuple[Population, Population], n: int, seed: int) -> float:
    """Count the robust interval's hits of its own truth, the median of VM/native."""
    native, vm = pops
    rng = np.random.default_rng(seed)
    nat = native.draw(rng, (ROBUST_EXPERIMENTS, n))
    v = vm.draw(rng, (ROBUST_EXPERIMENTS, n))
    s = hodges_lehmann_set(np.log(v), np.log(nat), CONF)
    truth = np.log(true_median_ratio(native, vm))
    return float(np.mean(s.bounded & (s.low <= truth) & (truth <= s.high)))


@pytest.mark.parametrize("n", [5, 20])
@pytest.mark.parametrize(
    "pops",
    [NORMAL, LOGNORMAL, OUTLIERS_BOTH, OUTLIERS_VM_ONLY],
    ids=["normal", "lognormal", "outliers-both", "outliers-vm-only"],
)
def test_robust_coverage_holds_in_every_population(
    pops: tuple[Population, Population], n: int
) -> None:
    """600 experiments: SE ~0.007 at 97%; a correct interval lands in [0.955, 0.995]
    (at n = 5 the exact interval's level is 98.4%, so up to 0.999). The VM-only outlier
    population is the one where Fieller fails (xfail above)."""
    coverage = _robust_coverage(pops, n, seed=5000 + n)
    print(f"{pops[1].kind} n={n}: Hodges-Lehmann 97% coverage {coverage:.4f}")
    assert 0.955 <= coverage <= (0.999 if n == 5 else 0.995)


@pytest.mark.parametrize(
    "pops", [NORMAL, LOGNORMAL, OUTLIERS_BOTH, OUTLIERS_VM_ONLY], ids=lambda p: p[1].kind
)
def test_true_median_ratio_matches_a_large_sample(pops: tuple[Population, Population]) -> None:
    native, vm = pops
    rng = np.random.default_rng(6)
    ratios = vm.draw(rng, (2_000_000,)) / native.draw(rng, (2_000_000,))
    sample_median = float(np.median(ratios))
    # SE of a sample median: sqrt(p(1-p)/N) / density at the median, from the sample
    spread = float(np.quantile(ratios, 0.505) - np.quantile(ratios, 0.495))
    se = 0.5 / np.sqrt(ratios.size) * spread / 0.01
    assert abs(true_median_ratio(native, vm) - sample_median) < 5 * se
    if native.kind == vm.kind == "lognormal":  # closed form: ratio of medians
        medians = [p.components()[0][1].median() for p in pops]
        assert true_median_ratio(native, vm) == pytest.approx(medians[1] / medians[0], rel=1e-9)


def test_robust_simulation_helper_counts_like_this_test() -> None:
    mine = _robust_coverage(OUTLIERS_VM_ONLY, 20, seed=8)
    theirs = robust_coverage(
        *OUTLIERS_VM_ONLY, n=20, experiments=ROBUST_EXPERIMENTS, confidence=CONF, seed=8
    )
    assert theirs.coverage == mine
    assert theirs.method == "hodges-lehmann"


def test_simulation_helper_counts_like_this_test() -> None:
    """benchmarks/stats_coverage.py uses simulate.fieller_coverage; it must agree with the
    independent count above (same seed, same draw order: native block, then VM block)."""
    mine, _ = _coverage(NORMAL, 20, seed=7)
    theirs = fieller_coverage(*NORMAL, n=20, experiments=EXPERIMENTS, confidence=CONF, seed=7)
    assert theirs.coverage == mine
    assert theirs.true_ratio == pytest.approx(1.1)
