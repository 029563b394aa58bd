"""A robust overhead: the Hodges-Lehmann ratio, with a distribution-free interval.

Why: the mean's interval (Fieller, bootstrap) breaks on the noise of a shared machine.
When 2% of the VM's runs are twice as slow, the 97% Fieller interval holds the true
ratio of means in only 61-90% of simulated experiments: most samples of 20 hold no slow
run, so the interval is narrow around the wrong value (benchmarks/stats_coverage.py).

Estimate: compare every VM run with every native run. With ``num`` and ``den`` oriented
as in overhead.py (lower is better: VM/native; higher is better: native/VM), the ratio is
the median of all pairwise ratios num_j/den_i - the Hodges-Lehmann shift of the
logarithms, exponentiated. One slow VM run alters only m of the n*m pairs, so it moves
the median by at most m ranks, however slow it was.

What it estimates (its true value): the median of num/den for one run of each drawn
independently, i.e. the r such that a random VM run is more than r times a random native
run (lower is better) half the time. When the two environments' runs differ only by a
factor (same shape on the log scale) this is exactly the ratio of their medians, and of
their means; when the shapes differ it is in general neither.

Interval: the union of two intervals built on the same pairwise log-ratios d:

- the exact Mann-Whitney interval [d_(k), d_(mn+1-k)], k from the exact null
  distribution of U (normal approximation beyond ``EXACT_MAX_PAIRS`` pairs). Exact at any
  n when the environments differ only by a factor; discrete, so at n = 5 its level is
  98.4% instead of 97%, which is what makes small samples safe.
- the Brunner-Munzel interval: the shifts the Brunner-Munzel test does not reject. Its
  variance comes from the placements of each sample, so it stays valid when the two
  spreads differ (a VM noisier than native; Mann-Whitney alone then held its truth in
  95.5% of log-normal experiments at n = 50). Degrees of freedom min(n, m) - 1 instead
  of Welch's, because Welch's held as little as 96.5% at n = 20-50 in the simulation.

The union covers whenever either covers; simulated coverage is >= 0.965 in every
population of benchmarks/stats_coverage.py, at a width 4% above Fieller's on normal runs
of 20-50 (docs/statistics.md). The values must be positive (logarithms).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from hpcvm.errors import BenchmarkError
from hpcvm.stats._checks import Sample, check_confidence, finite_sample
from hpcvm.stats.overhead import Overhead, overhead_result
from hpcvm.stats.summary import DEFAULT_CONFIDENCE

FloatArray = npt.NDArray[np.float64]
EXACT_MAX_PAIRS = 10_000


class RobustSet(NamedTuple):
    """Arrays, one element per experiment, on the log scale (exp gives ratios).

    ``low``/``high`` are NaN where ``bounded`` is false (no exact interval exists at this
    confidence with so few runs).
    """

    estimate: FloatArray
    low: FloatArray
    high: FloatArray
    bounded: npt.NDArray[np.bool_]


@functools.cache
def _mw_exact_cdf(m: int, n: int) -> tuple[float, ...]:
    """P(U <= u), u = 0..m*n, for U = #{(i, j): y_j > x_i} under the null (exchangeable).

    Recursion on the largest of the m + n values: a y (probability n/(m+n)) exceeds all m
    x's, an x exceeds no y. Every step is a convex combination, so it cannot overflow.
    """
    rows: list[npt.NDArray[np.float64]] = [np.ones(1) for _ in range(n + 1)]  # i = 0
    for i in range(1, m + 1):
        new = [np.ones(1)]
        for j in range(1, n + 1):
            p = np.zeros(i * j + 1)
            p[: (i - 1) * j + 1] += i / (i + j) * rows[j]
            p[i:] += j / (i + j) * new[j - 1]
            new.append(p)
        rows = new
    return tuple(float(c) for c in np.cumsum(rows[n]))


def mann_whitney_rank(m: int, n: int, confidence: float) -> int:
    """k of the distribution-free interval [d_(k), d_(mn+1-k)] (1-based order statistics
    of the m*n pairwise differences): the largest k with P(U <= k - 1) <= alpha/2.

    0 means no interval exists at this confidence (too few runs: at 97% it needs
    C(m+n, m) >= 2/0.03, e.g. 4 runs of each).
    """
    alpha_half = (1.0 - check_confidence(confidence)) / 2.0
    if m * n <= EXACT_MAX_PAIRS:
        cdf = np.asarray(_mw_exact_cdf(m, n))
        return int(np.searchsorted(cdf, alpha_half * (1.0 + 1e-12), side="right"))
    sd = math.sqrt(m * n * (m + n + 1) / 12.0)
    z = float(sps.norm.ppf(1.0 - alpha_half))
    return max(0, math.floor(m * n / 2.0 - z * sd + 0.5))


def brunner_munzel(x: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Brunner-Munzel statistic and Welch-type df of x against y, row-wise.

    Positive when y tends to be larger. Same definition as scipy.stats.brunnermunzel
    (which the tests use as the oracle), vectorised over the leading axis. Where the
    placement variance is zero (complete separation) the statistic is +-inf, 0 on ties.
    """
    m, n = x.shape[-1], y.shape[-1]
    joint = sps.rankdata(np.concatenate([x, y], axis=-1), axis=-1)
    px = joint[..., :m] - sps.rankdata(x, axis=-1)  # placements: y's below each x
    py = joint[..., m:] - sps.rankdata(y, axis=-1)
    sx = px.var(axis=-1, ddof=1)
    sy = py.var(axis=-1, ddof=1)
    spread = m * sx + n * sy
    shift = joint[..., m:].mean(axis=-1) - joint[..., :m].mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = m * n * shift / ((m + n) * np.sqrt(spread))
        df = spread**2 / ((m * sx) ** 2 / (m - 1) + (n * sy) ** 2 / (n - 1))
        t = np.where(spread > 0.0, t, np.sign(shift) * np.inf)
        t = np.where((spread > 0.0) | (shift != 0.0), t, 0.0)
    return np.asarray(t, dtype=np.float64), np.asarray(df, dtype=np.float64)


def _bm_bounds(
    num: FloatArray, den: FloatArray, d: FloatArray, crit: float
) -> tuple[FloatArray, FloatArray]:
    """Brunner-Munzel interval by bisection over the gaps between sorted differences.

    The statistic is constant between consecutive differences d_j < d_(j+1) and falls
    as the shift grows, so each bound is found at a gap midpoint. NaN where the test
    rejects every shift.
    """
    rows = np.arange(d.shape[0])
    last = d.shape[1] - 1  # gaps 1..last between d[j-1] and d[j] (0-based d)

    def stat(gap: npt.NDArray[np.intp]) -> FloatArray:
        theta = (d[rows, gap - 1] + d[rows, gap]) / 2.0
        return brunner_munzel(den, num - theta[:, None])[0]

    lo, hi = np.ones(d.shape[0], np.intp), np.full(d.shape[0], last, np.intp)
    while np.any(lo < hi):  # first gap whose statistic is <= crit
        mid = (lo + hi) // 2
        active, ok = lo < hi, stat(mid) <= crit
        hi, lo = np.where(active & ok, mid, hi), np.where(active & ~ok, mid + 1, lo)
    low = np.where(stat(lo) <= crit, d[rows, lo - 1], np.nan)
    lo, hi = np.ones(d.shape[0], np.intp), np.full(d.shape[0], last, np.intp)
    while np.any(lo < hi):  # last gap whose statistic is >= -crit
        mid = (lo + hi + 1) // 2
        active, ok = lo < hi, stat(mid) >= -crit
        lo, hi = np.where(active & ok, mid, lo), np.where(active & ~ok, mid - 1, hi)
    high = np.where(stat(lo) >= -crit, d[rows, lo], np.nan)
    return low, high


def hodges_lehmann_set(
    num_logs: npt.ArrayLike, den_logs: npt.ArrayLike, confidence: float
) -> RobustSet:
    """Hodges-Lehmann shift of num over den and its interval, one row per experiment.

    ``num_logs`` (E, n) and ``den_logs`` (E, m) are logarithms; the result is on the
    log scale too. Vectorised so the coverage simulation runs this very code.
    """
    num = np.atleast_2d(np.asarray(num_logs, dtype=np.float64))
    den = np.atleast_2d(np.asarray(den_logs, dtype=np.float64))
    n, m = num.shape[1], den.shape[1]
    d = np.sort((num[:, None, :] - den[:, :, None]).reshape(num.shape[0], -1), axis=1)
    estimate = np.median(d, axis=1)
    k = mann_whitney_rank(m, n, confidence)
    nan = np.full(d.shape[0], np.nan)
    if k < 1 or min(m, n) < 2:
        return RobustSet(estimate, nan, nan, np.zeros(d.shape[0], dtype=bool))
    low, high = d[:, k - 1], d[:, m * n - k]
    crit = float(sps.t.ppf(0.5 + confidence / 2.0, min(m, n) - 1))
    bm_low, bm_high = _bm_bounds(num, den, d, crit)
    return RobustSet(
        estimate=estimate,
        low=np.fmin(low, bm_low),
        high=np.fmax(high, bm_high),
        bounded=np.ones(d.shape[0], dtype=bool),
    )


def _positive(values: Sample, what: str) -> FloatArray:
    arr = finite_sample(values, f"robust overhead: {what}")
    if np.any(arr <= 0.0):
        raise BenchmarkError(
            f"robust overhead: the {what} values include zero or negatives; it compares "
            "logarithms, so use the mean's overhead (fieller) for this metric"
        )
    return arr


def robust_overhead(
    native: Sample,
    vm: Sample,
    *,
    higher_is_better: bool,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Overhead:
    """Hodges-Lehmann overhead of ``vm`` against ``native`` (see module doc).

    Returns an Overhead with ``method="hodges-lehmann"``: ``ratio`` is the median pairwise
    ratio (oriented like overhead(): > 1 means the VM is worse), ``df`` is None.
    Raises BenchmarkError for an empty, non-finite or non-positive sample, UsageError for
    a bad confidence.
    """
    conf = check_confidence(confidence)
    nat, v = _positive(native, "native"), _positive(vm, "VM")
    num, den = (nat, v) if higher_is_better else (v, nat)
    s = hodges_lehmann_set(np.log(num), np.log(den), conf)
    ratio = math.exp(float(s.estimate[0]))
    base: dict[str, object] = {
        "method": "hodges-lehmann",
        "higher_is_better": higher_is_better,
        "confidence": conf,
        "n_native": int(nat.size),
        "n_vm": int(v.size),
        "ratio": ratio,
        "overhead_pct": (ratio - 1.0) * 100.0,
    }
    if not bool(s.bounded[0]):
        note = (
            f"no robust interval: {nat.size} native and {v.size} VM runs are too few for a "
            f"distribution-free {conf * 100:g}% interval (4 runs of each suffice at 97%)"
        )
        return overhead_result(base, None, None, note)
    return overhead_result(base, math.exp(float(s.low[0])), math.exp(float(s.high[0])), "")
