"""summarize() against independent references: scipy's t.interval with sem, numpy and
the standard library's statistics module (exact rational arithmetic)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats as sps

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.stats import summarize

# A small sample with a hand-checkable mean (10.0): the reference study's style of data.
KNOWN = [9.8, 10.1, 10.3, 9.9, 10.2, 9.7]


def _scipy_interval(values: list[float], confidence: float) -> tuple[float, float]:
    """The textbook interval computed by scipy, independently of hpcvm's code path."""
    low, high = sps.t.interval(
        confidence, len(values) - 1, loc=np.mean(values), scale=sps.sem(values)
    )
    return float(low), float(high)


@pytest.mark.parametrize("confidence", [0.97, 0.95, 0.99])
def test_known_data_matches_scipy(confidence: float) -> None:
    s = summarize(KNOWN, confidence)
    low, high = _scipy_interval(KNOWN, confidence)
    assert s.n == 6
    assert s.mean == pytest.approx(10.0, rel=1e-12)
    assert s.stdev == pytest.approx(statistics.stdev(KNOWN), rel=1e-12)
    assert s.ci_low == pytest.approx(low, rel=1e-12)
    assert s.ci_high == pytest.approx(high, rel=1e-12)
    assert s.half_width == pytest.approx((high - low) / 2, rel=1e-9)
    assert (s.min, s.max, s.median) == (9.7, 10.3, statistics.median(KNOWN))
    assert s.confidence == confidence


def test_n2_uses_one_degree_of_freedom() -> None:
    # t(0.985, 1) is about 21.2: a two-sample interval is very wide, and must be.
    values = [1.0, 2.0]
    s = summarize(values)
    low, high = _scipy_interval(values, 0.97)
    assert s.ci_low == pytest.approx(low, rel=1e-12)
    assert s.ci_high == pytest.approx(high, rel=1e-12)
    t1 = 1.0 / math.tan(math.pi * 0.015)  # closed form of t(1-p, df=1) = cot(pi*p)
    assert s.half_width == pytest.approx(t1 * statistics.stdev(values) / math.sqrt(2), rel=1e-9)


def test_large_n_matches_scipy_and_numpy() -> None:
    rng = np.random.default_rng(20240601)
    values = rng.normal(123.0, 4.0, size=100_000).tolist()
    s = summarize(values)
    low, high = _scipy_interval(values, 0.97)
    assert s.mean == pytest.approx(statistics.fmean(values), rel=1e-12)
    assert s.stdev == pytest.approx(float(np.std(values, ddof=1)), rel=1e-10)
    assert s.ci_low == pytest.approx(low, rel=1e-12)
    assert s.ci_high == pytest.approx(high, rel=1e-12)
    # at large n the t quantile is the normal one
    z = sps.norm.ppf(0.985)
    assert s.stdev is not None
    assert s.half_width == pytest.approx(z * s.stdev / math.sqrt(len(values)), rel=1e-4)


def test_single_sample_has_no_interval() -> None:
    s = summarize([42.0])
    assert (s.n, s.mean, s.min, s.max, s.median) == (1, 42.0, 42.0, 42.0, 42.0)
    assert s.stdev is None and s.half_width is None
    assert s.ci_low is None and s.ci_high is None
    assert s.relative_half_width is None


def test_constant_sample_has_zero_width() -> None:
    s = summarize([5.0, 5.0, 5.0])
    assert s.stdev == 0.0 and s.half_width == 0.0
    assert s.ci_low == s.ci_high == 5.0
    assert s.relative_half_width == 0.0


def test_relative_half_width() -> None:
    s = summarize([-9.0, -11.0, -10.0])
    assert s.half_width is not None
    assert s.relative_half_width == pytest.approx(s.half_width / 10.0)


def test_json_round_trip() -> None:
    s = summarize(KNOWN)
    assert type(s).model_validate_json(s.model_dump_json()) == s


@pytest.mark.parametrize(
    ("values", "confidence", "error"),
    [
        ([], 0.97, BenchmarkError),
        ([1.0, float("nan")], 0.97, BenchmarkError),
        ([1.0, float("inf")], 0.97, BenchmarkError),
        ([1.0, 2.0], 0.0, UsageError),
        ([1.0, 2.0], 1.0, UsageError),
        ([1.0, 2.0], 97.0, UsageError),
    ],
)
def test_bad_input_is_a_one_line_error(
    values: list[float], confidence: float, error: type[Exception]
) -> None:
    with pytest.raises(error) as info:
        summarize(values, confidence)
    assert "\n" not in str(info.value)
