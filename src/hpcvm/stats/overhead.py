"""Overhead of a VM against native, as a ratio of means with a confidence interval.

Definition (METHOD.md): overhead is a fraction of native performance, signed so that a
positive number always means "the VM is worse":

- lower is better (time):        r = mean_vm / mean_native
- higher is better (throughput): r = mean_native / mean_vm
- overhead % = (r - 1) * 100

The interval of r comes from Fieller's theorem (see fieller.py) or from a BCa bootstrap
of the two independent samples (scipy.stats.bootstrap, fixed seed so a report can be
reproduced). The overhead is *significant* only when its interval excludes zero overhead
(r = 1); an unbounded or missing interval is never significant, because nothing can be
claimed when the denominator is indistinguishable from zero.

The bootstrap undercovers with few runs: in benchmarks/stats_coverage.py its 97% BCa
interval held the true ratio in only 88-91% of experiments at n = 5 (Fieller: 96-97%),
so results from fewer than ``BOOTSTRAP_MIN_N`` runs per side carry a note saying so.

Both intervals fail when rare slow runs hit one environment only (Fieller 62-90%
coverage, bootstrap 57-74%): robust.py offers the Hodges-Lehmann overhead beside this
one, and trust.py says when this one's interval should not be trusted.

Not offered on purpose: the delta method with per-run standard deviations (what
hyperfine prints) - it is a spread of single runs, not an interval of the ratio.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.model import Frozen
from hpcvm.stats._checks import Sample, check_confidence, finite_sample
from hpcvm.stats.fieller import fieller_set
from hpcvm.stats.summary import DEFAULT_CONFIDENCE

Method = Literal["fieller", "bootstrap"]
"""Interval methods of the mean's overhead (what ``overhead(method=...)`` accepts)."""
OverheadMethod = Literal["fieller", "bootstrap", "hodges-lehmann"]
"""Every method an Overhead can come from; ``hodges-lehmann`` is robust.py's."""
DEFAULT_BOOTSTRAP_SEED = 20_130_701
DEFAULT_RESAMPLES = 9999
BOOTSTRAP_MIN_N = 20


class Overhead(Frozen):
    """The VM's overhead against native with its interval and how it was obtained.

    ``bounded`` is false when no finite interval exists (Fieller with the denominator
    not significantly non-zero, fewer than 2 samples on a side, or a degenerate
    bootstrap); the ``*_ci_*`` fields are then ``None`` and ``note`` says why.
    ``df`` is the t degrees of freedom Fieller used (``None`` for the bootstrap).
    ``ratio`` is the method's estimate: the ratio of means for fieller and bootstrap,
    the median pairwise ratio for hodges-lehmann (robust.py).
    """

    method: OverheadMethod
    higher_is_better: bool
    confidence: float
    n_native: int
    n_vm: int
    ratio: float
    ratio_ci_low: float | None
    ratio_ci_high: float | None
    overhead_pct: float
    overhead_ci_low: float | None
    overhead_ci_high: float | None
    significant: bool
    bounded: bool
    df: float | None = None
    note: str = ""


def _pct(ratio: float) -> float:
    return (ratio - 1.0) * 100.0


def overhead_result(
    base: dict[str, object], low: float | None, high: float | None, note: str
) -> Overhead:
    """Assemble an Overhead from the interval of r (``None`` bounds: no interval)."""
    bounded = low is not None and high is not None
    significant = low is not None and high is not None and (low > 1.0 or high < 1.0)
    return Overhead.model_validate(
        {
            **base,
            "ratio_ci_low": low,
            "ratio_ci_high": high,
            "overhead_ci_low": None if low is None else _pct(low),
            "overhead_ci_high": None if high is None else _pct(high),
            "significant": significant,
            "bounded": bounded,
            "note": note,
        }
    )


def _fieller(
    num: npt.NDArray[np.float64], den: npt.NDArray[np.float64], conf: float, den_name: str
) -> tuple[float | None, float | None, float, str]:
    s = fieller_set(
        float(num.mean()),
        float(num.var(ddof=1)) / num.size,
        num.size,
        float(den.mean()),
        float(den.var(ddof=1)) / den.size,
        den.size,
        conf,
    )
    df = float(s.df)
    if bool(s.bounded):
        return float(s.low), float(s.high), df, ""
    level = f"{conf * 100:g}%"
    if bool(s.whole_line):
        shape = "the confidence set is every real number"
    elif math.isnan(float(s.gap_low)):
        shape = "the confidence set is a half-line"
    else:
        shape = (
            f"the confidence set is two unbounded rays outside "
            f"({float(s.gap_low):.4g}, {float(s.gap_high):.4g})"
        )
    note = (
        f"interval unbounded: the {den_name} mean is not significantly non-zero at {level} "
        f"(Fieller g = {float(s.g):.3g} >= 1); {shape}; add runs or reduce noise"
    )
    return None, None, df, note


def _bootstrap(
    native: npt.NDArray[np.float64],
    vm: npt.NDArray[np.float64],
    conf: float,
    higher_is_better: bool,
    seed: int,
    n_resamples: int,
) -> tuple[float | None, float | None, str]:
    def ratio(
        nat: npt.NDArray[np.float64], v: npt.NDArray[np.float64], axis: int
    ) -> npt.NDArray[np.float64]:
        mn, mv = nat.mean(axis=axis), v.mean(axis=axis)
        return np.asarray(mn / mv if higher_is_better else mv / mn, dtype=np.float64)

    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
        warnings.simplefilter("always")
        res = sps.bootstrap(
            (native, vm),
            ratio,
            n_resamples=n_resamples,
            vectorized=True,
            paired=False,
            confidence_level=conf,
            method="BCa",
            rng=np.random.default_rng(seed),
        )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isfinite(low) and math.isfinite(high):
        return low, high, ""
    why = str(caught[0].message).splitlines()[0] if caught else "non-finite bounds"
    return None, None, f"bootstrap interval undefined (degenerate resamples: {why})"


def overhead(
    native: Sample,
    vm: Sample,
    *,
    higher_is_better: bool,
    confidence: float = DEFAULT_CONFIDENCE,
    method: Method = "fieller",
    seed: int = DEFAULT_BOOTSTRAP_SEED,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> Overhead:
    """Overhead of ``vm`` against ``native`` (independent samples of one metric).

    ``seed`` and ``n_resamples`` only matter for ``method="bootstrap"``. Raises
    BenchmarkError for an empty or non-finite sample or a zero denominator mean,
    UsageError for an unknown method or a bad confidence.
    """
    conf = check_confidence(confidence)
    if method not in ("fieller", "bootstrap"):
        raise UsageError(f"unknown overhead interval method {method!r}; use fieller or bootstrap")
    if n_resamples < 100:
        raise UsageError(f"bootstrap needs at least 100 resamples, got {n_resamples}")
    nat = finite_sample(native, "overhead: native")
    v = finite_sample(vm, "overhead: vm")
    num, den, den_name = (nat, v, "VM") if higher_is_better else (v, nat, "native")
    if float(den.mean()) == 0.0:
        raise BenchmarkError(f"overhead undefined: the {den_name} mean is zero")
    ratio = float(num.mean()) / float(den.mean())
    base: dict[str, object] = {
        "method": method,
        "higher_is_better": higher_is_better,
        "confidence": conf,
        "n_native": int(nat.size),
        "n_vm": int(v.size),
        "ratio": ratio,
        "overhead_pct": _pct(ratio),
    }
    if nat.size < 2 or v.size < 2:
        note = "no interval: it needs at least 2 samples of both native and VM"
        return overhead_result(base, None, None, note)
    if method == "fieller":
        low, high, df, note = _fieller(num, den, conf, den_name)
        return overhead_result({**base, "df": df}, low, high, note)
    blow, bhigh, note = _bootstrap(nat, v, conf, higher_is_better, seed, n_resamples)
    if not note and min(nat.size, v.size) < BOOTSTRAP_MIN_N:
        note = (
            f"bootstrap interval from fewer than {BOOTSTRAP_MIN_N} runs per side is too narrow "
            "(simulated coverage ~0.9 at n=5); prefer method fieller"
        )
    return overhead_result(base, blow, bhigh, note)
