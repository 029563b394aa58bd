"""Mean and Student-t confidence interval of one metric's samples.

This is the reference studies' figure: mean ± t(1 - alpha/2, n - 1)·s/√n with
alpha = 1 - confidence (0.97 by default). The interval describes where the *mean* lies,
not the spread of single runs, so it narrows as runs are added; n is always reported
beside it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from hpcvm.model import Frozen
from hpcvm.stats._checks import Sample, check_confidence, finite_sample

DEFAULT_CONFIDENCE = 0.97


class Summary(Frozen):
    """Descriptive statistics and the interval of the mean of one sample.

    With a single sample the standard deviation and the interval do not exist; those
    fields are ``None`` rather than 0 or infinity so no caller can mistake one run for
    a perfectly precise measurement.
    """

    n: int
    mean: float
    stdev: float | None
    ci_low: float | None
    ci_high: float | None
    half_width: float | None
    confidence: float
    min: float
    max: float
    median: float

    @property
    def relative_half_width(self) -> float | None:
        """Half-width as a fraction of |mean| (what ``--target 1%`` is compared with)."""
        if self.half_width is None:
            return None
        if self.mean == 0.0:
            return 0.0 if self.half_width == 0.0 else math.inf
        return self.half_width / abs(self.mean)


def t_quantile(confidence: float, df: float) -> float:
    """Two-sided Student-t critical value t(1 - alpha/2, df), alpha = 1 - confidence."""
    return float(sps.t.ppf(0.5 + confidence / 2.0, df))


def summarize(values: Sample, confidence: float = DEFAULT_CONFIDENCE) -> Summary:
    """Summarise one metric's samples with a Student-t interval of the mean.

    Raises BenchmarkError for an empty sample or non-finite values, UsageError for a
    confidence outside (0, 1).
    """
    conf = check_confidence(confidence)
    arr = finite_sample(values, "summary")
    n = int(arr.size)
    mean = float(np.mean(arr))
    stdev: float | None = None
    half: float | None = None
    if n >= 2:
        stdev = float(np.std(arr, ddof=1))
        half = t_quantile(conf, n - 1) * stdev / math.sqrt(n)
    return Summary(
        n=n,
        mean=mean,
        stdev=stdev,
        ci_low=None if half is None else mean - half,
        ci_high=None if half is None else mean + half,
        half_width=half,
        confidence=conf,
        min=float(np.min(arr)),
        max=float(np.max(arr)),
        median=float(np.median(arr)),
    )
