"""overhead(): Fieller and bootstrap intervals of a ratio of means.

References are computed here independently of hpcvm's code: the defining inequality of
Fieller's set with t from scipy, the delta-method interval, and the algebraic fact that
the Fieller set of b/a is the reciprocal of the set of a/b.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats as sps

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.stats import Overhead, overhead


def _samples(
    seed: int, n: int, native: tuple[float, float], vm: tuple[float, float]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    rng = np.random.default_rng(seed)
    return rng.normal(*native, size=n), rng.normal(*vm, size=n)


def _half(o: Overhead) -> float:
    assert o.ratio_ci_low is not None and o.ratio_ci_high is not None
    return (o.ratio_ci_high - o.ratio_ci_low) / 2


def test_point_estimate_and_sign_convention() -> None:
    # time: VM takes 10% longer -> +10%;  throughput: VM delivers 20% less -> +25%
    t = overhead([10.0, 10.0, 10.0], [11.0, 11.0, 11.0], higher_is_better=False)
    assert t.ratio == pytest.approx(1.1) and t.overhead_pct == pytest.approx(10.0)
    thr = overhead([100.0, 100.0], [80.0, 80.0], higher_is_better=True)
    assert thr.ratio == pytest.approx(1.25) and thr.overhead_pct == pytest.approx(25.0)


def test_fieller_bounds_solve_the_defining_equation() -> None:
    """Both bounds make (a - rho*b)^2 = t^2 (va + rho^2 vb) hold, with t from scipy at the
    Welch-Satterthwaite degrees of freedom evaluated at the point estimate."""
    native, vm = _samples(1, 12, (50.0, 2.0), (60.0, 5.0))
    o = overhead(native, vm, higher_is_better=False)
    a, b = vm.mean(), native.mean()
    va, vb = vm.var(ddof=1) / vm.size, native.var(ddof=1) / native.size
    r = a / b
    df = (va + r * r * vb) ** 2 / (va**2 / (vm.size - 1) + (r * r * vb) ** 2 / (native.size - 1))
    t = sps.t.ppf(1 - 0.03 / 2, df)
    assert o.df == pytest.approx(df, rel=1e-12)
    for rho in (o.ratio_ci_low, o.ratio_ci_high):
        assert rho is not None
        assert (a - rho * b) ** 2 == pytest.approx(t * t * (va + rho * rho * vb), rel=1e-9)
    assert o.ratio_ci_low < o.ratio < o.ratio_ci_high  # type: ignore[operator]
    assert o.overhead_ci_low == pytest.approx((o.ratio_ci_low - 1) * 100)  # type: ignore[operator]
    assert o.overhead_ci_high == pytest.approx((o.ratio_ci_high - 1) * 100)  # type: ignore[operator]


def test_fieller_agrees_with_bootstrap_for_a_clear_denominator() -> None:
    """n = 200, CV 4-5%: both intervals estimate the same thing. Tolerance 6% of the
    half-width per endpoint: the Monte Carlo error of a 1.5% tail quantile from 9999
    resamples is about 1.5% of the half-width (3 SE = 4.5%), and the bootstrap's normal
    rather than t quantile and its n/(n-1) variance add about 1%."""
    native, vm = _samples(7, 200, (100.0, 4.0), (112.0, 6.0))
    f = overhead(native, vm, higher_is_better=False)
    b = overhead(native, vm, higher_is_better=False, method="bootstrap", seed=3)
    assert b.method == "bootstrap" and b.df is None and b.bounded
    hw = _half(f)
    assert b.ratio_ci_low == pytest.approx(f.ratio_ci_low, abs=0.06 * hw)
    assert b.ratio_ci_high == pytest.approx(f.ratio_ci_high, abs=0.06 * hw)
    assert b.note == ""


def test_small_sample_bootstrap_carries_a_warning_note() -> None:
    native, vm = _samples(8, 19, (100.0, 4.0), (112.0, 6.0))
    b = overhead(native, vm, higher_is_better=False, method="bootstrap")
    assert b.bounded and "prefer method fieller" in b.note
    assert overhead(native, vm, higher_is_better=False).note == ""


def test_fieller_agrees_with_delta_method_at_large_n() -> None:
    """n = 5000: Fieller's centre shifts from r by about r*g with g = t^2 vb/b^2 ~ 1e-6
    here, and t(df ~ 8000) differs from z by < 0.1%, so the endpoints agree with the
    delta-method interval r ± z*r*sqrt(va/a^2 + vb/b^2) to within 0.5% of the half-width."""
    native, vm = _samples(11, 5000, (20.0, 1.0), (23.0, 1.5))
    o = overhead(native, vm, higher_is_better=False)
    a, b = vm.mean(), native.mean()
    r = a / b
    se = r * math.sqrt(vm.var(ddof=1) / vm.size / a**2 + native.var(ddof=1) / native.size / b**2)
    z = sps.norm.ppf(0.985)
    assert o.ratio_ci_low == pytest.approx(r - z * se, abs=0.005 * z * se)
    assert o.ratio_ci_high == pytest.approx(r + z * se, abs=0.005 * z * se)


def test_higher_is_better_is_the_reciprocal_interval() -> None:
    """For throughput r = native/vm; Fieller's set for b/a is exactly the reciprocal of
    the set for a/b (divide the defining inequality by rho^2), and the Welch degrees of
    freedom are the same, so the bounds must be exact reciprocals."""
    native, vm = _samples(5, 15, (1000.0, 30.0), (900.0, 40.0))
    thr = overhead(native, vm, higher_is_better=True)
    time = overhead(native, vm, higher_is_better=False)
    assert thr.ratio == pytest.approx(1 / time.ratio, rel=1e-12)
    assert thr.ratio_ci_low == pytest.approx(1 / time.ratio_ci_high, rel=1e-9)  # type: ignore[operator]
    assert thr.ratio_ci_high == pytest.approx(1 / time.ratio_ci_low, rel=1e-9)  # type: ignore[operator]
    assert thr.overhead_pct > 0 and thr.significant  # the VM delivers less: worse
    assert time.overhead_pct < 0 and time.significant


def test_not_significant_when_interval_contains_zero_overhead() -> None:
    native, vm = _samples(2, 10, (100.0, 5.0), (100.0, 5.0))
    for method in ("fieller", "bootstrap"):
        o = overhead(native, vm, higher_is_better=False, method=method)
        assert o.bounded and o.overhead_ci_low is not None and o.overhead_ci_high is not None
        assert o.overhead_ci_low < 0 < o.overhead_ci_high
        assert not o.significant


def test_significant_when_interval_excludes_zero() -> None:
    native, vm = _samples(3, 10, (100.0, 1.0), (105.0, 1.0))
    o = overhead(native, vm, higher_is_better=False)
    assert o.overhead_ci_low is not None and o.overhead_ci_low > 0 and o.significant


def test_unbounded_whole_line_when_denominator_is_noise() -> None:
    """The native mean is indistinguishable from zero: no interval exists."""
    o = overhead([0.1, -0.1, 0.2], [1.0, 2.0, 1.5], higher_is_better=False)
    assert not o.bounded and not o.significant
    assert o.ratio_ci_low is None and o.ratio_ci_high is None
    assert o.overhead_ci_low is None and o.overhead_ci_high is None
    assert "unbounded" in o.note and "every real number" in o.note
    assert o.ratio == pytest.approx(1.5 / (0.2 / 3))


def test_unbounded_two_rays_when_numerator_is_clear() -> None:
    """Numerator clearly non-zero, denominator not: Fieller's set is two rays; the note
    gives the excluded gap, which must contain 0 (rho = 0 would need a = 0)."""
    o = overhead([1.0, -0.5, 1.2, -0.3], [10.0, 10.1, 9.9, 10.0], higher_is_better=False)
    assert not o.bounded and not o.significant and "two unbounded rays" in o.note
    gap = o.note.split("outside (")[1].split(")")[0]
    low, high = (float(x) for x in gap.split(","))
    assert low < 0 < high


def test_fewer_than_two_samples_gives_no_interval() -> None:
    o = overhead([10.0], [11.0, 12.0], higher_is_better=False)
    assert o.ratio == pytest.approx(1.15) and not o.bounded and not o.significant
    assert o.ratio_ci_low is None and "at least 2 samples" in o.note


def test_bootstrap_is_reproducible_with_its_seed() -> None:
    native, vm = _samples(4, 12, (10.0, 0.5), (11.0, 0.7))
    one = overhead(native, vm, higher_is_better=False, method="bootstrap", seed=1)
    again = overhead(native, vm, higher_is_better=False, method="bootstrap", seed=1)
    other = overhead(native, vm, higher_is_better=False, method="bootstrap", seed=2)
    assert one == again
    assert one.ratio_ci_low != other.ratio_ci_low


def test_degenerate_bootstrap_is_reported_not_invented() -> None:
    o = overhead([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], higher_is_better=False, method="bootstrap")
    assert not o.bounded and o.ratio_ci_low is None and "bootstrap" in o.note


@pytest.mark.parametrize(
    ("native", "vm", "kwargs", "error"),
    [
        ([], [1.0, 2.0], {}, BenchmarkError),
        ([1.0, 2.0], [math.nan, 2.0], {}, BenchmarkError),
        ([1.0, -1.0], [1.0, 2.0], {}, BenchmarkError),  # native mean 0: ratio undefined
        ([1.0, 2.0], [1.0, 2.0], {"method": "delta"}, UsageError),
        ([1.0, 2.0], [1.0, 2.0], {"confidence": 1.5}, UsageError),
    ],
)
def test_bad_input(
    native: list[float], vm: list[float], kwargs: dict[str, object], error: type
) -> None:
    with pytest.raises(error) as info:
        overhead(native, vm, higher_is_better=False, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
