"""Flag outlying repetitions of one metric (METHOD.md, "Outliers"): kept, only marked.

Rule: on the log scale (benchmark figures are positive and skewed; a run twice as slow
and one twice as fast are equally far from the rest there), a run is an outlier when

    |log x - median(log x)| > c(n) * MAD(log x)

with MAD scaled to estimate a normal standard deviation (x 1.4826). Median and MAD are
not moved by the outliers they look for, unlike mean and standard deviation (one run
twice as slow among twenty inflates s so much that it hides itself).

Why the threshold depends on n: a fixed cut-off (the usual 3.5) flags something in 10-20%
of perfectly clean samples of 5-20 runs, because the MAD of a few runs is itself noisy.
``c(n)`` is instead the 99th percentile of the largest |z| in a normal sample of n runs,
found by simulation with a fixed seed (deterministic, computed once per n). So a clean
sample whose logarithms are normal - log-normal runs, and normal runs with a small
coefficient of variation, which are nearly so - gets any flag at all with probability
1% (``FALSE_FLAG_RATE``), whatever n; benchmarks/stats_coverage.py measures that rate and
the chance of catching a run twice as slow. Below ``MIN_FLAG_N`` runs nothing is
flagged: with 3 or 4 runs even a tenfold outlier cannot be told apart at that rate.

A sample holding zero or negative values (counts, differences) has no logarithm; it is
judged on its own scale with the same rule. When more than half of the values are equal
the MAD is zero; the mean absolute deviation from the median (x 1.2533, also a normal
standard deviation estimate) stands in for it, so quantised figures are not all flagged.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from hpcvm.stats._checks import Sample, finite_sample

MIN_FLAG_N = 5
FALSE_FLAG_RATE = 0.01
_CALIBRATION_DRAWS = 20_000
_CALIBRATION_SEED = 20_240_917
_CALIBRATION_MAX_N = 1000
_MAD_TO_SD = float(1.0 / sps.norm.ppf(0.75))  # 1.4826: MAD of a normal is 0.6745 sd
_MEAN_AD_TO_SD = float(np.sqrt(np.pi / 2.0))  # mean |x - median| of a normal is 0.798 sd


def _robust_z(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """|x - median| / robust scale, row-wise over the last axis; 0 where the scale is 0."""
    med = np.median(values, axis=-1, keepdims=True)
    dev = np.abs(values - med)
    mad = _MAD_TO_SD * np.median(dev, axis=-1)
    fallback = _MEAN_AD_TO_SD * dev.mean(axis=-1)
    scale = np.where(mad > 0.0, mad, fallback)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(scale > 0.0, dev / scale, 0.0)
    return np.asarray(z, dtype=np.float64)


@functools.cache
def outlier_threshold(n: int) -> float:
    """c(n): the (1 - FALSE_FLAG_RATE) quantile of max |z| over a normal sample of n.

    Simulated with a fixed seed, so it is the same number on every call and machine.
    Beyond ``_CALIBRATION_MAX_N`` runs the simulated value at that size is scaled by how
    the normal maximum itself grows (the MAD is precise there), to keep the cost bounded.
    """
    if n < MIN_FLAG_N:
        return float("inf")
    size = min(n, _CALIBRATION_MAX_N)
    rng = np.random.default_rng(_CALIBRATION_SEED + size)
    largest = np.concatenate(
        [
            _robust_z(rng.standard_normal((chunk, size))).max(axis=-1)
            for chunk in _chunks(_CALIBRATION_DRAWS, max(1, 2_000_000 // size))
        ]
    )
    c = float(np.quantile(largest, 1.0 - FALSE_FLAG_RATE))
    if n > size:
        c *= _normal_max_quantile(n) / _normal_max_quantile(size)
    return c


def _chunks(total: int, step: int) -> list[int]:
    return [min(step, total - start) for start in range(0, total, step)]


def _normal_max_quantile(n: int) -> float:
    """Quantile of max |Z| over n standard normals at the calibrated false-flag rate."""
    per_value = (1.0 - FALSE_FLAG_RATE) ** (1.0 / n)
    return float(sps.norm.ppf(0.5 + per_value / 2.0))


def flag_outliers(values: Sample) -> tuple[bool, ...]:
    """One flag per value, in order: True where the run is an outlier (see module doc).

    Raises BenchmarkError for an empty or non-finite sample. Fewer than MIN_FLAG_N
    values: nothing is flagged.
    """
    arr = finite_sample(values, "outlier flags")
    if arr.size < MIN_FLAG_N:
        return (False,) * int(arr.size)
    scaled = np.log(arr) if bool(np.all(arr > 0.0)) else arr
    z = _robust_z(scaled)
    return tuple(bool(f) for f in z > outlier_threshold(int(arr.size)))


def outlier_count(values: Sample) -> int:
    """How many of ``values`` flag_outliers marks."""
    return sum(flag_outliers(values))
