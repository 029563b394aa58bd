"""Known populations for checking intervals by simulation (METHOD.md, "Check the interval").

An interval's confidence level is a promise about repeated experiments: 97% of them
should cover the true value. The only way to check that promise for real-looking data is
to draw many experiments from populations whose true means are known in closed form and
count. Pure: every draw comes from a numpy Generator built from an explicit seed.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import numpy.typing as npt

from hpcvm.errors import UsageError
from hpcvm.model import Frozen
from hpcvm.stats.fieller import fieller_set
from hpcvm.stats.overhead import overhead

Kind = Literal["normal", "lognormal", "outliers"]


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


class Coverage(Frozen):
    """How often the overhead interval covered the true ratio of population means."""

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
