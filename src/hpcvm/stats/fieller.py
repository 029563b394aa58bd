"""Fieller's confidence set for a ratio of two independent normal means, vectorised.

Why Fieller and not the delta method: the ratio of two sample means is not normal, and
its uncertainty grows without bound as the denominator approaches zero. Fieller's
theorem inverts the t test of ``a - rho*b = 0``, the set of rho with

    (a - rho*b)^2 <= t^2 * (va + rho^2 * vb)

where ``a``, ``b`` are the numerator and denominator means and ``va``, ``vb`` the
variances *of those means* (s^2/n each; the samples are independent so there is no
covariance term). It is exact for normal means with known variances, and honest when
the denominator is not clearly non-zero: the set is then unbounded and no interval
exists.

Degrees of freedom: the two samples may have different variances (a VM is usually
noisier than the host), so t uses the Welch-Satterthwaite degrees of freedom of
``a - rho*b`` evaluated at the point estimate rho = a/b:

    df = (va + r^2 vb)^2 / (va^2/(na - 1) + r^4 vb^2/(nb - 1))

the plug-in used for heteroscedastic Fieller intervals by Tamhane and Logan (2004) and by
R's mratios::ttestratio(var.equal = FALSE). The coverage simulation in the tests and in
benchmarks/stats_coverage.py checks this choice.

The functions here work on numpy arrays so the coverage simulation can compute thousands
of intervals at once with the very code the user's numbers come from.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from hpcvm.errors import BenchmarkError
from hpcvm.stats._checks import check_confidence

FloatArray = npt.NDArray[np.float64]


class FiellerSet(NamedTuple):
    """Arrays of equal shape, one element per experiment.

    ``low``/``high`` are the interval bounds where ``bounded`` is true and NaN elsewhere.
    ``g`` = t^2 vb / b^2 (bounded exactly when g < 1). ``whole_line`` is true where the
    set is every real number; where unbounded but not whole, it is the two rays outside
    (``gap_low``, ``gap_high``).
    """

    low: FloatArray
    high: FloatArray
    bounded: npt.NDArray[np.bool_]
    g: FloatArray
    df: FloatArray
    t: FloatArray
    whole_line: npt.NDArray[np.bool_]
    gap_low: FloatArray
    gap_high: FloatArray


def welch_df(
    num_var: npt.ArrayLike,
    num_n: npt.ArrayLike,
    den_var: npt.ArrayLike,
    den_n: npt.ArrayLike,
    ratio: npt.ArrayLike,
) -> FloatArray:
    """Welch-Satterthwaite degrees of freedom of ``a - r*b`` (variances are of the means).

    When both variances are zero the formula is 0/0; the interval then has zero width
    whatever t is, and the pooled na + nb - 2 is returned to keep t finite.
    """
    va, vb, r = (np.asarray(x, dtype=np.float64) for x in (num_var, den_var, ratio))
    na, nb = (np.asarray(x, dtype=np.float64) for x in (num_n, den_n))
    scaled_vb = r * r * vb
    denom = va * va / (na - 1.0) + scaled_vb * scaled_vb / (nb - 1.0)
    pooled = na + nb - 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(denom > 0.0, (va + scaled_vb) ** 2 / denom, pooled)
    return np.asarray(df, dtype=np.float64)


def fieller_set(
    num_mean: npt.ArrayLike,
    num_var: npt.ArrayLike,
    num_n: npt.ArrayLike,
    den_mean: npt.ArrayLike,
    den_var: npt.ArrayLike,
    den_n: npt.ArrayLike,
    confidence: float,
) -> FiellerSet:
    """Fieller confidence set for num_mean/den_mean, element-wise over arrays.

    ``num_var``/``den_var`` are variances of the means (s^2/n); ``num_n``/``den_n`` the
    sample sizes (at least 2 each, for a variance and for the degrees of freedom).
    """
    conf = check_confidence(confidence)
    a, va, b, vb = (np.asarray(x, dtype=np.float64) for x in (num_mean, num_var, den_mean, den_var))
    na, nb = (np.asarray(x, dtype=np.float64) for x in (num_n, den_n))
    if np.any(na < 2) or np.any(nb < 2):
        raise BenchmarkError("Fieller interval needs at least 2 samples on each side")
    if np.any(b == 0.0):
        raise BenchmarkError("ratio undefined: the denominator mean is zero")
    ratio = a / b
    df = welch_df(va, na, vb, nb, ratio)
    t = np.asarray(sps.t.ppf(0.5 + conf / 2.0, df), dtype=np.float64)
    t2 = t * t
    lead = b * b - t2 * vb  # leading coefficient of the quadratic in rho, = b^2 (1 - g)
    g = t2 * vb / (b * b)
    bounded = lead > 0.0
    disc = a * a * vb + b * b * va - t2 * va * vb  # >= 0 whenever bounded
    root = t * np.sqrt(np.maximum(disc, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        r1 = (a * b - root) / lead
        r2 = (a * b + root) / lead
    nan = np.full(np.shape(r1), np.nan)
    whole = ~bounded & (disc < 0.0)
    rays = ~bounded & ~whole & (lead != 0.0)
    return FiellerSet(
        low=np.where(bounded, r1, nan),
        high=np.where(bounded, r2, nan),
        bounded=bounded,
        g=g,
        df=df,
        t=t,
        whole_line=whole,
        gap_low=np.where(rays, np.minimum(r1, r2), nan),
        gap_high=np.where(rays, np.maximum(r1, r2), nan),
    )
