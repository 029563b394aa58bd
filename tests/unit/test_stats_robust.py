"""The robust (Hodges-Lehmann) overhead against independent oracles.

Oracles: scipy.stats.mannwhitneyu's exact and asymptotic null distributions for the
interval's rank k, scipy.stats.brunnermunzel for the statistic and (scanned over every
candidate shift) for the interval, and a brute-force median of all pairwise ratios for
the estimate. Coverage lives in test_stats_coverage.py.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import stats as sps

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.stats import overhead, robust_overhead
from hpcvm.stats.robust import brunner_munzel, hodges_lehmann_set, mann_whitney_rank

CONF = 0.97


def _samples_with_u(m: int, n: int, u: int) -> tuple[list[float], list[float]]:
    """x (m values) and y (n values) with exactly u pairs x_i > y_j, no ties."""
    y = [float(j) for j in range(n)]
    counts = [min(n, max(0, u - n * i)) for i in range(m)]  # ys below each x, summing to u
    x = [c - 0.5 + i * 1e-4 for i, c in enumerate(counts)]
    assert sum(xi > yj for xi in x for yj in y) == u
    return x, y


def _p_at_most(m: int, n: int, u: int, method: str) -> float:
    x, y = _samples_with_u(m, n, u)
    return float(sps.mannwhitneyu(x, y, alternative="less", method=method).pvalue)


@pytest.mark.parametrize(("m", "n"), [(4, 4), (5, 5), (4, 9), (8, 6), (20, 20), (50, 50)])
def test_mann_whitney_rank_is_the_exact_quantile(m: int, n: int) -> None:
    """P(U <= k-1) <= alpha/2 < P(U <= k), with P from scipy's exact distribution."""
    k = mann_whitney_rank(m, n, CONF)
    assert k >= 1
    assert _p_at_most(m, n, k - 1, "exact") <= (1 - CONF) / 2
    assert _p_at_most(m, n, k, "exact") > (1 - CONF) / 2


def test_mann_whitney_rank_large_samples_use_the_normal_approximation() -> None:
    m = n = 120  # beyond EXACT_MAX_PAIRS
    k = mann_whitney_rank(m, n, CONF)
    assert _p_at_most(m, n, k - 1, "asymptotic") <= (1 - CONF) / 2
    assert _p_at_most(m, n, k, "asymptotic") > (1 - CONF) / 2


def test_no_exact_interval_with_three_runs_each() -> None:
    # C(6, 3) = 20 orderings: even the widest interval has level 1 - 2/20 = 0.9 < 0.97
    assert mann_whitney_rank(3, 3, CONF) == 0
    assert mann_whitney_rank(4, 4, CONF) == 1  # 1 - 2/70 = 0.971


@pytest.mark.parametrize(("m", "n", "seed"), [(5, 5, 1), (7, 12, 2), (20, 20, 3)])
def test_brunner_munzel_matches_scipy(m: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.lognormal(0.0, 0.3, size=(4, m))
    y = rng.lognormal(0.2, 0.1, size=(4, n))
    y[0, :3] = x[0, :3]  # ties across the samples
    t, df = brunner_munzel(x, y)
    for row in range(4):
        ref = sps.brunnermunzel(x[row], y[row])
        assert t[row] == pytest.approx(ref.statistic, rel=1e-12)
        # scipy's p-value comes from t(df): recover df through it
        assert 2 * sps.t.sf(abs(t[row]), df[row]) == pytest.approx(ref.pvalue, rel=1e-9)


def _brute_force_ratio(num: list[float], den: list[float]) -> float:
    ratios = sorted(a / b for a, b in itertools.product(num, den))
    mid = len(ratios) // 2
    if len(ratios) % 2:
        return ratios[mid]
    return math.sqrt(ratios[mid - 1] * ratios[mid])  # median of logs, exponentiated


def _oracle_interval(num: list[float], den: list[float]) -> tuple[float, float]:
    """Union of the exact Mann-Whitney interval (k checked above against scipy) and the
    shifts scipy's Brunner-Munzel statistic does not reject, scanned gap by gap."""
    d = sorted(math.log(a) - math.log(b) for a, b in itertools.product(num, den))
    k = mann_whitney_rank(len(den), len(num), CONF)
    crit = sps.t.ppf(0.5 + CONF / 2, min(len(num), len(den)) - 1)
    accepted = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for j in range(1, len(d)):
            theta = (d[j - 1] + d[j]) / 2
            stat = sps.brunnermunzel(np.log(den), np.log(num) - theta).statistic
            if abs(stat) <= crit:
                accepted.append(j)
    low = min(d[k - 1], d[accepted[0] - 1]) if accepted else d[k - 1]
    high = max(d[len(d) - k], d[accepted[-1]]) if accepted else d[len(d) - k]
    return math.exp(low), math.exp(high)


@pytest.mark.parametrize(("n_nat", "n_vm", "seed"), [(5, 5, 11), (8, 6, 12), (15, 15, 13)])
@pytest.mark.parametrize("higher_is_better", [False, True])
def test_robust_overhead_matches_brute_force(
    n_nat: int, n_vm: int, seed: int, higher_is_better: bool
) -> None:
    rng = np.random.default_rng(seed)
    nat = list(rng.lognormal(math.log(100), 0.05, n_nat))
    vm = list(rng.lognormal(math.log(112), 0.2, n_vm))
    vm[0] *= 3.0  # an outlier
    o = robust_overhead(nat, vm, higher_is_better=higher_is_better, confidence=CONF)
    num, den = (nat, vm) if higher_is_better else (vm, nat)
    assert o.method == "hodges-lehmann"
    assert (o.n_native, o.n_vm) == (n_nat, n_vm)
    assert o.ratio == pytest.approx(_brute_force_ratio(num, den), rel=1e-12)
    low, high = _oracle_interval(num, den)
    assert o.ratio_ci_low == pytest.approx(low, rel=1e-12)
    assert o.ratio_ci_high == pytest.approx(high, rel=1e-12)
    assert o.overhead_pct == pytest.approx((o.ratio - 1) * 100)
    assert o.significant == (low > 1 or high < 1)


def test_bisection_finds_the_scanned_bounds_over_many_samples() -> None:
    """The vectorised bisection assumes the statistic falls with the shift; check it
    against the exhaustive scan on many random samples of skewed, tied data."""
    rng = np.random.default_rng(5)
    nat = np.round(rng.lognormal(math.log(100), 0.3, (30, 9)), 0)
    vm = np.round(rng.lognormal(math.log(105), 0.1, (30, 9)), 0)
    s = hodges_lehmann_set(np.log(vm), np.log(nat), CONF)
    for row in range(30):
        low, high = _oracle_interval(list(vm[row]), list(nat[row]))
        assert math.exp(s.low[row]) == pytest.approx(low, rel=1e-12)
        assert math.exp(s.high[row]) == pytest.approx(high, rel=1e-12)


def test_one_wild_run_barely_moves_the_robust_ratio() -> None:
    rng = np.random.default_rng(8)
    nat = rng.normal(100, 2, 20)
    vm = rng.normal(110, 3, 20)
    clean = robust_overhead(nat, vm, higher_is_better=False)
    vm[4] *= 50.0
    wild = robust_overhead(nat, vm, higher_is_better=False)
    mean = overhead(nat, vm, higher_is_better=False)
    assert clean.ratio_ci_low is not None and clean.ratio_ci_high is not None
    assert clean.ratio_ci_low <= wild.ratio <= clean.ratio_ci_high
    assert mean.ratio > 3.0  # the mean's ratio is dragged along
    assert wild.ratio < 1.15


def test_too_few_runs_give_no_interval_with_a_note() -> None:
    o = robust_overhead([1.0, 1.1, 0.9], [2.0, 2.1, 1.9], higher_is_better=False)
    assert o.ratio == pytest.approx(2.0, rel=0.1)
    assert not o.bounded and not o.significant
    assert o.ratio_ci_low is None and o.overhead_ci_high is None
    assert "too few" in o.note


@pytest.mark.parametrize("bad", [[1.0, 0.0, 2.0, 1.0], [1.0, -2.0, 1.0, 1.0]])
def test_non_positive_values_are_refused(bad: list[float]) -> None:
    with pytest.raises(BenchmarkError, match="zero or negatives") as err:
        robust_overhead([1.0, 1.1, 1.2, 1.3], bad, higher_is_better=False)
    assert "\n" not in err.value.message


def test_bad_input_is_refused() -> None:
    with pytest.raises(BenchmarkError, match="no samples"):
        robust_overhead([], [1.0], higher_is_better=False)
    with pytest.raises(BenchmarkError, match="NaN"):
        robust_overhead([1.0, math.nan], [1.0, 2.0], higher_is_better=False)
    with pytest.raises(UsageError, match="confidence"):
        robust_overhead([1.0, 2.0], [1.0, 2.0], higher_is_better=False, confidence=97)
