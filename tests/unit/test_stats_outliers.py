"""flag_outliers on constructed data, and its false-flag rate on clean data.

The z-scores are recomputed here from the definition (numpy median, MAD x 1.4826 from
scipy.stats.median_abs_deviation) rather than taken from the module.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from hpcvm.errors import BenchmarkError
from hpcvm.stats import MIN_FLAG_N, flag_outliers, outlier_count, outlier_threshold
from hpcvm.stats.simulate import Population


def _clean(n: int, seed: int = 1) -> list[float]:
    values = list(np.random.default_rng(seed).normal(100.0, 2.0, n))
    assert not any(flag_outliers(values))  # 1% of clean samples have a flag: not this one
    return values


def test_a_run_twice_as_slow_is_flagged_alone() -> None:
    values = _clean(20)
    values[7] *= 2.0
    flags = flag_outliers(values)
    assert flags == tuple(i == 7 for i in range(20))
    assert outlier_count(values) == 1


def test_a_run_twice_as_fast_is_as_far_on_the_log_scale() -> None:
    values = _clean(20)
    values[2] /= 2.0
    assert flag_outliers(values) == tuple(i == 2 for i in range(20))


def test_flags_follow_the_definition() -> None:
    rng = np.random.default_rng(17)
    for n in (5, 9, 30):
        for _ in range(20):
            values = rng.lognormal(4.0, 0.2, n)
            values[0] *= rng.choice([1.0, 1.5, 3.0])
            logs = np.log(values)
            mad = sps.median_abs_deviation(logs, scale="normal")
            z = np.abs(logs - np.median(logs)) / mad
            assert flag_outliers(values) == tuple(bool(f) for f in z > outlier_threshold(n))


def test_fewer_than_the_minimum_flag_nothing() -> None:
    assert MIN_FLAG_N == 5
    assert flag_outliers([1.0, 1.0, 1000.0, 1.01]) == (False,) * 4
    assert flag_outliers([1.0, 1.01, 1000.0, 0.99, 1.0]) == (False, False, True, False, False)


def test_equal_values_are_never_flagged() -> None:
    assert flag_outliers([3.0] * 10) == (False,) * 10


def test_quantised_figures_with_zero_mad() -> None:
    """More than half equal: the MAD is 0 and the mean absolute deviation stands in."""
    assert flag_outliers([12.34] * 3 + [12.35, 12.36]) == (False,) * 5
    assert flag_outliers([1.0] * 19 + [2.0]) == (False,) * 19 + (True,)


def test_counts_with_zeros_are_judged_on_their_own_scale() -> None:
    counts = [0.0, 1.0, 0.0, 2.0, 1.0, 0.0, 1.0, 1.0, 0.0, 2.0, 1.0, 40.0]
    assert flag_outliers(counts) == (False,) * 11 + (True,)


def test_threshold_is_the_calibrated_quantile_of_the_largest_z() -> None:
    """Recompute c(n) by an independent simulation (other seed, scipy's MAD)."""
    rng = np.random.default_rng(4242)
    for n in (5, 20):
        z = rng.standard_normal((20_000, n))
        mad = sps.median_abs_deviation(z, axis=1, scale="normal")
        largest = np.max(np.abs(z - np.median(z, axis=1, keepdims=True)) / mad[:, None], axis=1)
        assert outlier_threshold(n) == pytest.approx(np.quantile(largest, 0.99), rel=0.1)
    assert math.isinf(outlier_threshold(4))
    # with many runs the MAD is precise: c(n) nears the 99% quantile of max |Z| over n
    # normals (it falls from n = 5 while the MAD settles, then grows with n)
    for n in (1000, 5000):
        normal_max = sps.norm.ppf(0.5 + 0.99 ** (1 / n) / 2)
        assert outlier_threshold(n) == pytest.approx(normal_max, rel=0.05)
    assert outlier_threshold(5000) > outlier_threshold(1000)


@pytest.mark.parametrize(
    "pop",
    [
        Population(kind="normal", base=100.0, cv=0.05),
        Population(kind="lognormal", base=1.0, cv=0.3),
    ],
    ids=["normal", "lognormal"],
)
@pytest.mark.parametrize("n", [5, 20])
def test_false_flag_rate_on_clean_samples_is_about_one_percent(pop: Population, n: int) -> None:
    """1,000 clean samples: binomial SE of a 1% rate is 0.3%; bounds are ~3 SE."""
    samples = pop.draw(np.random.default_rng(n), (1000, n))
    rate = sum(any(flag_outliers(s)) for s in samples) / 1000
    assert 0.0 <= rate <= 0.02


def test_bad_input_is_refused() -> None:
    with pytest.raises(BenchmarkError, match="no samples"):
        flag_outliers([])
    with pytest.raises(BenchmarkError, match="NaN"):
        flag_outliers([1.0, math.inf, 2.0, 3.0, 4.0])
