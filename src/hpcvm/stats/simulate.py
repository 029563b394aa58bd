"""Known populations for checking intervals by simulation (METHOD.md, "Check the interval").

An interval's confidence level is a promise about repeated experiments: 97% of them
should cover the true value. The only way to check that promise for real-looking data is
to draw many experiments from populations whose true means are known in closed form and
count. Pure: every draw comes from a numpy Generator built from an explicit seed.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy import integrate, optimize
from scipy import stats as sps

from hpcvm.errors import UsageError
from hpcvm.model import Frozen
from hpcvm.stats.fieller import fieller_set
from hpcvm.stats.overhead import overhead
from hpcvm.stats.robust import hodges_lehmann_set

Kind = Literal["normal", "lognormal", "outliers"]
_GRID_POINTS = 20_001


class Population(Frozen):
    """A benchmark metric's run-to-run distribution with a closed-form mean.

    - ``normal``: N(base, (cv*base)^2).
    - ``lognormal``: log-normal with mean ``base`` and coefficient of variation ``cv``
      (sigma^2 = ln(1 + cv^2), mu = ln(base) - sigma^2/2): skewed like timings are.
    - ``outliers``: normal as above, but each run with probability ``outlier_prob`` is
      ``outlier_factor`` times slower (another tenant, a page-cache miss): true mean
      base * (1 + p * (k - 1)).
    """

    kind: Kind
    base: float
    cv: float
    outlier_prob: float = 0.0
    outlier_factor: float = 1.0

    @property
    def true_mean(self) -> float:
        """The population mean, from the parameters alone (no sampling)."""
        if self.kind == "outliers":
            return self.base * (1.0 + self.outlier_prob * (self.outlier_factor - 1.0))
        return self.base

    def components(self) -> list[tuple[float, Any]]:
        """The distribution as (weight, frozen scipy distribution) pairs, weights summing
        to 1: what ``draw`` samples from, in closed form (for true medians and ratios).
        Typed Any: scipy's frozen distributions have no usable common static type."""
        sd = self.cv * self.base
        if self.kind == "lognormal":
            sigma2 = math.log1p(self.cv * self.cv)
            mu = math.log(self.base) - sigma2 / 2.0
            return [(1.0, sps.lognorm(s=math.sqrt(sigma2), scale=math.exp(mu)))]
        if self.kind == "outliers":
            k, p = self.outlier_factor, self.outlier_prob
            return [(1.0 - p, sps.norm(self.base, sd)), (p, sps.norm(k * self.base, k * sd))]
        return [(1.0, sps.norm(self.base, sd))]

    def cdf(self, x: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """P(run <= x)."""
        arr = np.asarray(x, dtype=np.float64)
        total = np.zeros(arr.shape)
        for weight, dist in self.components():
            total += weight * np.asarray(dist.cdf(arr), dtype=np.float64)
        return total

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> npt.NDArray[np.float64]:
        """Independent runs of this metric, in an array of ``shape``."""
        if self.kind == "lognormal":
            sigma2 = math.log1p(self.cv * self.cv)
            mu = math.log(self.base) - sigma2 / 2.0
            return rng.lognormal(mu, math.sqrt(sigma2), size=shape)
        values = rng.normal(self.base, self.cv * self.base, size=shape)
        if self.kind == "outliers":
            slow = rng.random(size=shape) < self.outlier_prob
            values = np.where(slow, values * self.outlier_factor, values)
        return values


def true_median_ratio(native: Population, vm: Population) -> float:
    """The robust overhead's true value: the median of Y/X for independent runs X of
    ``native`` and Y of ``vm`` (lower is better), i.e. the r with P(Y <= r X) = 1/2.

    P(Y <= r X) = sum over native components c of w_c * integral f_c(x) F_vm(r x) dx,
    each integral by Simpson's rule on a fine grid over its own component's support
    (quantiles 1e-15 to 1 - 1e-15; the normals' negative tail is far below that), then
    solved for r by Brent's method. Checked against a large simulated sample in tests.
    """
    grids = []
    for weight, dist in native.components():
        x = np.linspace(dist.ppf(1e-15), dist.isf(1e-15), _GRID_POINTS)
        grids.append((weight, x, dist.pdf(x)))

    def below(r: float) -> float:
        total = sum(w * integrate.simpson(f * vm.cdf(r * x), x=x) for w, x, f in grids)
        return float(total) - 0.5

    guess = vm.true_mean / native.true_mean
    return float(optimize.brentq(below, guess / 4.0, guess * 4.0, xtol=1e-13))


class Coverage(Frozen):
    """How often the overhead interval covered its true value: the ratio of population
    means for fieller and bootstrap, true_median_ratio for hodges-lehmann."""

    method: str
    n: int
    experiments: int
    covered: int
    unbounded: int
    true_ratio: float
    median_relative_width: float

    @property
    def coverage(self) -> float:
        return self.covered / self.experiments


def _check(n: int, experiments: int) -> None:
    if n < 2 or experiments < 1:
        raise UsageError(f"simulation needs n >= 2 and experiments >= 1, got {n}, {experiments}")


def fieller_coverage(
    native: Population,
    vm: Population,
    *,
    n: int,
    experiments: int,
    confidence: float,
    seed: int,
) -> Coverage:
    """Coverage of the Fieller interval of mean_vm/mean_native (lower is better), all
    experiments at once (vectorised). An unbounded set counts as *not* covering."""
    _check(n, experiments)
    rng = np.random.default_rng(seed)
    nat = native.draw(rng, (experiments, n))
    v = vm.draw(rng, (experiments, n))
    s = fieller_set(
        v.mean(axis=1),
        v.var(axis=1, ddof=1) / n,
        n,
        nat.mean(axis=1),
        nat.var(axis=1, ddof=1) / n,
        n,
        confidence,
    )
    truth = vm.true_mean / native.true_mean
    covered = s.bounded & (s.low <= truth) & (truth <= s.high)
    widths = (s.high - s.low)[s.bounded] / truth
    return Coverage(
        method="fieller",
        n=n,
        experiments=experiments,
        covered=int(np.count_nonzero(covered)),
        unbounded=int(np.count_nonzero(~s.bounded)),
        true_ratio=truth,
        median_relative_width=float(np.median(widths)) if widths.size else math.inf,
    )


def bootstrap_coverage(
    native: Population,
    vm: Population,
    *,
    n: int,
    experiments: int,
    confidence: float,
    seed: int,
    n_resamples: int = 2000,
) -> Coverage:
    """Coverage of the BCa bootstrap interval; one scipy bootstrap per experiment, so
    slow: use fewer experiments and resamples than for Fieller, and say so."""
    _check(n, experiments)
    rng = np.random.default_rng(seed)
    truth = vm.true_mean / native.true_mean
    covered = unbounded = 0
    widths: list[float] = []
    for i in range(experiments):
        o = overhead(
            native.draw(rng, (n,)),
            vm.draw(rng, (n,)),
            higher_is_better=False,
            confidence=confidence,
            method="bootstrap",
            seed=seed + i,
            n_resamples=n_resamples,
        )
        if o.ratio_ci_low is None or o.ratio_ci_high is None:
            unbounded += 1
            continue
        covered += int(o.ratio_ci_low <= truth <= o.ratio_ci_high)
        widths.append((o.ratio_ci_high - o.ratio_ci_low) / truth)
    return Coverage(
        method="bootstrap",
        n=n,
        experiments=experiments,
        covered=covered,
        unbounded=unbounded,
        true_ratio=truth,
        median_relative_width=float(np.median(widths)) if widths else math.inf,
    )


def robust_coverage(
    native: Population,
    vm: Population,
    *,
    n: int,
    experiments: int,
    confidence: float,
    seed: int,
) -> Coverage:
    """Coverage of the Hodges-Lehmann interval (robust.py) of its true value,
    true_median_ratio; vectorised, same draw order as fieller_coverage."""
    _check(n, experiments)
    rng = np.random.default_rng(seed)
    nat = native.draw(rng, (experiments, n))
    v = vm.draw(rng, (experiments, n))
    if np.any(nat <= 0.0) or np.any(v <= 0.0):
        raise UsageError("population drew a non-positive run; lower its cv")
    s = hodges_lehmann_set(np.log(v), np.log(nat), confidence)
    truth = true_median_ratio(native, vm)
    low, high = np.exp(s.low), np.exp(s.high)
    covered = s.bounded & (low <= truth) & (truth <= high)
    widths = (high - low)[s.bounded] / truth
    return Coverage(
        method="hodges-lehmann",
        n=n,
        experiments=experiments,
        covered=int(np.count_nonzero(covered)),
        unbounded=int(np.count_nonzero(~s.bounded)),
        true_ratio=truth,
        median_relative_width=float(np.median(widths)) if widths.size else math.inf,
    )
