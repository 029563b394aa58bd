"""What measured OS/hypervisor noise costs a bulk-synchronous code at scale (pure).

The model (docs/scale.md has the assumptions and where it is wrong): P ranks each compute
a grain of work G, then meet in a collective. A step lasts as long as its slowest rank
plus the collective's cost, so one rank's detour delays all P; a detour rare on one core
is common among thousands (Petrini et al. 2003; Hoefler, Schneider and Lumsdaine 2010).

- A rank's delay in one step is drawn from the measured noise itself: the detours
  (duration minus its CPU's fastest quantum) of ``m = round(G/q)`` consecutive quanta of
  one CPU's trace, summed (a sliding window, so bursts longer than a quantum stay
  whole), scaled by ``G/(m q)``. A grain shorter than the quantum ``q`` is hit by a
  quantum's detour with probability ``G/q`` (thinning) and is otherwise undelayed.
- Ranks are independent draws from the pooled windows of every trace, so the step's
  maximum delay has the CDF ``F(x)^P``: drawing ``V = U^(1/P)`` and taking F's
  ``V``-quantile samples it exactly in O(1) per step, whatever P.
- The collective costs ``latency * ceil(log2 P)`` (a LogP-style tree: one message latency
  per stage); no noise strikes it.

``slowdown = E[step] / (G + collective) - 1``: against a perfectly quiet machine of the
same speed and network. The point estimate is the exact expectation of the maximum over
the pooled empirical distribution; the interval comes from a bootstrap that resamples
the measured traces (each run's CPU is one unit) and takes the same exact expectation in
each replicate, so it is an interval of the expectation, holding the point by
construction. (It once simulated 1,000 steps per replicate instead: a finite run's mean
of heavy-tailed detours is skewed, and its percentile band could miss the expectation,
as CI showed at one core and a 10 us grain.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.model import Frozen
from hpcvm.stats._checks import check_confidence

Floats = npt.NDArray[np.float64]
Trace = Sequence[int] | npt.NDArray[Any]

DEFAULT_GRAINS_NS = (10_000, 100_000, 1_000_000, 10_000_000)
DEFAULT_CORES = tuple(2**k for k in range(15))  # 1 .. 16,384
DEFAULT_RESAMPLES = 200
MIN_WINDOWS = 10  # a trace shorter than ten grains says nothing about that grain


@dataclass(frozen=True)
class Delays:
    """One grain's per-rank delay distribution: sorted values (ns), the weight of each
    value, and which trace it came from (for the bootstrap). The weights of one trace sum
    to its probability of being delayed at all; the rest is an atom at zero."""

    values: Floats
    weights: Floats
    trace: npt.NDArray[np.intp]
    traces: int

    def cdf(self, multiplicity: Floats | None = None) -> tuple[Floats, Floats]:
        """Support (0 first) and cumulative probability, traces weighted by
        ``multiplicity`` (a bootstrap's counts; all ones by default)."""
        k = np.ones(self.traces) if multiplicity is None else multiplicity
        w = self.weights * k[self.trace]
        total = float(k.sum())
        zero = total - float(w.sum())
        cum = np.cumsum(np.concatenate(([max(zero, 0.0)], w))) / total
        cum[-1] = 1.0
        return np.concatenate(([0.0], self.values)), cum


def _detours(trace: Trace, where: str) -> npt.NDArray[np.int64]:
    d = np.asarray(trace)
    if d.ndim != 1 or d.size == 0 or not np.issubdtype(d.dtype, np.integer):
        raise BenchmarkError(f"scale: {where} has no integer quantum durations")
    ns: npt.NDArray[np.int64] = d.astype(np.int64)
    low = int(ns.min())
    if low <= 0:
        raise BenchmarkError(f"scale: {where} has a non-positive quantum duration")
    return ns - low


def window_delays(trace: Trace, grain_ns: float, where: str = "trace") -> tuple[Floats, float]:
    """One trace's per-step delays for a grain and the probability a step is delayed at
    all (1 for grains of a quantum or more; ``G/q`` below, see the module docstring)."""
    if grain_ns <= 0:
        raise UsageError(f"scale: the grain must be positive, got {grain_ns} ns")
    detours = _detours(trace, where)
    q = float(np.asarray(trace).min())
    if grain_ns < q:
        return detours.astype(np.float64), grain_ns / q
    m = max(1, round(grain_ns / q))
    if detours.size < MIN_WINDOWS * m:
        raise BenchmarkError(
            f"scale: {where} has {detours.size} quanta of {q / 1e3:.3g} us, too few for "
            f"a grain of {grain_ns / 1e3:g} us (at least {MIN_WINDOWS * m} needed): "
            "run the noise suite with more --noise-quanta or predict for a finer grain"
        )
    sums = np.convolve(detours, np.ones(m, dtype=np.int64), mode="valid")
    return sums.astype(np.float64) * (grain_ns / (m * q)), 1.0


def delays(traces: Sequence[Trace], grain_ns: float) -> Delays:
    """The pooled delay distribution of every trace (each trace weighs the same)."""
    if not traces:
        raise BenchmarkError("scale: no noise traces to predict from")
    parts, weights, owner = [], [], []
    for i, t in enumerate(traces):
        values, p = window_delays(t, grain_ns, f"noise trace {i}")
        parts.append(values)
        weights.append(np.full(values.size, p / values.size))
        owner.append(np.full(values.size, i, dtype=np.intp))
    return _merged(
        np.concatenate(parts), np.concatenate(weights), np.concatenate(owner), len(traces)
    )


def _merged(values: Floats, weights: Floats, owner: npt.NDArray[np.intp], traces: int) -> Delays:
    """Sorted by value, equal (value, trace) pairs merged into one weight: integer-ns
    detours repeat a lot, and every bootstrap replicate walks this array."""
    order = np.lexsort((owner, values))
    values, weights, owner = values[order], weights[order], owner[order]
    start = np.flatnonzero(np.concatenate(([True], (np.diff(values) != 0) | (np.diff(owner) != 0))))
    return Delays(
        values=values[start],
        weights=np.add.reduceat(weights, start),
        trace=owner[start],
        traces=traces,
    )


def collective_ns(cores: int, latency_ns: float) -> float:
    """A tree collective's cost on ``cores`` ranks: one latency per stage."""
    return latency_ns * math.ceil(math.log2(cores)) if cores > 1 else 0.0


def expected_max(support: Floats, cum: Floats, cores: int) -> float:
    """E[max of ``cores`` independent draws] from a discrete distribution, exactly:
    sum of x_i (F_i^P - F_{i-1}^P)."""
    powered = cum**cores
    return float(np.dot(support, np.diff(np.concatenate(([0.0], powered)))))


class ScalePoint(Frozen):
    """One core count's predicted step time (ns) and slowdown (%) with its interval."""

    cores: int
    step_ns: float
    step_low_ns: float
    step_high_ns: float
    slowdown_pct: float
    slowdown_low_pct: float
    slowdown_high_pct: float


class ScaleCurve(Frozen):
    """One environment's prediction for one grain over the core counts asked."""

    env: str
    grain_ns: float
    latency_ns: float
    traces: int
    resamples: int
    confidence: float
    points: tuple[ScalePoint, ...]


@dataclass(frozen=True)
class Prediction:
    """A curve and the bootstrap replicates behind it (``replicates[b, i]``: expected
    step time of replicate b at ``cores[i]``), which an overhead between two curves needs."""

    curve: ScaleCurve
    point: Floats
    replicates: Floats


@dataclass(frozen=True)
class ScaleParams:
    """What a prediction is asked for; the defaults are the issue's grains and cores."""

    grain_ns: float
    cores: tuple[int, ...] = DEFAULT_CORES
    latency_ns: float = 0.0
    resamples: int = DEFAULT_RESAMPLES
    confidence: float = 0.97
    seed: int = 0

    def check(self) -> None:
        if not self.cores or min(self.cores) < 1:
            raise UsageError(f"scale: core counts must be 1 or more, got {list(self.cores)}")
        if self.latency_ns < 0:
            raise UsageError(
                f"scale: the collective latency must be 0 or more, not {self.latency_ns}"
            )
        if self.resamples < 1:
            raise UsageError("scale: resamples must be 1 or more")
        check_confidence(self.confidence)


MAX_BINS = 4096


def binned_delays(d: Delays) -> tuple[Floats, Floats]:
    """The delays on at most MAX_BINS log-spaced bins (zero kept apart), each bin's value
    the weighted mean of what fell in it: (support, weights[trace, bin]). A bootstrap
    replicate then costs traces x bins, not the millions of windows of long grains; a bin
    is under 0.5 % wide for detours from 1 ns to 10 s."""
    positive = d.values > 0
    if d.values.size <= MAX_BINS or not positive.any():
        index = np.arange(d.values.size)
    else:
        edges = np.geomspace(d.values[positive][0], d.values[-1], MAX_BINS)
        index = np.where(positive, np.searchsorted(edges, d.values, side="left") + 1, 0)
    bins = int(index.max()) + 1
    per_trace = np.zeros((d.traces, bins))
    np.add.at(per_trace, (d.trace, index), d.weights)
    total = per_trace.sum(axis=0)
    used = total > 0
    sums = np.bincount(index, weights=d.weights * d.values, minlength=bins)
    return sums[used] / total[used], per_trace[:, used]


def _expected_maxima(
    support: Floats, per_trace: Floats, counts: Floats, cores: Sequence[int]
) -> Floats:
    """E[max] at every core count when trace t counts ``counts[t]`` times (a bootstrap
    replicate; all ones for the point): the traces' weights per bin, with the rest of
    their mass the atom at zero (``support[0]``)."""
    weights = counts @ per_trace
    total = float(counts.sum())
    cum = np.cumsum(np.concatenate(([max(total - float(weights.sum()), 0.0)], weights)))
    cum /= total
    cum[-1] = 1.0
    return np.array([expected_max(support, cum, c) for c in cores])


def _point_and_replicates(
    d: Delays, p: ScaleParams, rng: np.random.Generator
) -> tuple[Floats, Floats]:
    """The expected delay of the slowest rank at each core count (the point) and the same
    in each bootstrap replicate of the traces (B x cores). Both from the same binned
    distribution, so the replicates are centred on the point they bound."""
    values, per_trace = binned_delays(d)
    support = np.concatenate(([0.0], values))
    point = _expected_maxima(support, per_trace, np.ones(d.traces), p.cores)
    out = np.empty((p.resamples, len(p.cores)))
    for b in range(p.resamples):
        counts = np.bincount(rng.integers(0, d.traces, d.traces), minlength=d.traces)
        out[b] = _expected_maxima(support, per_trace, counts.astype(np.float64), p.cores)
    return point, out


def predict(env: str, traces: Sequence[Trace], params: ScaleParams) -> Prediction:
    """The step time and slowdown of a bulk-synchronous code at each core count, from one
    environment's measured quantum durations (one sequence per run and CPU)."""
    params.check()
    d = delays(traces, params.grain_ns)
    rng = np.random.default_rng([params.seed, params.resamples, int(params.grain_ns)])
    base = np.array([params.grain_ns + collective_ns(c, params.latency_ns) for c in params.cores])
    delay, replicates = _point_and_replicates(d, params, rng)
    point, reps = base + delay, base + replicates
    alpha = (1.0 - params.confidence) / 2.0
    low, high = np.quantile(reps, [alpha, 1.0 - alpha], axis=0)
    points = tuple(
        ScalePoint(
            cores=c,
            step_ns=float(point[i]),
            step_low_ns=float(low[i]),
            step_high_ns=float(high[i]),
            slowdown_pct=100.0 * (point[i] / base[i] - 1.0),
            slowdown_low_pct=100.0 * (low[i] / base[i] - 1.0),
            slowdown_high_pct=100.0 * (high[i] / base[i] - 1.0),
        )
        for i, c in enumerate(params.cores)
    )
    curve = ScaleCurve(
        env=env,
        grain_ns=params.grain_ns,
        latency_ns=params.latency_ns,
        traces=d.traces,
        resamples=params.resamples,
        confidence=params.confidence,
        points=points,
    )
    return Prediction(curve=curve, point=point, replicates=reps)


class ScaleOverhead(Frozen):
    """An environment's predicted overhead against the baseline at one core count (%)."""

    env: str
    baseline: str
    grain_ns: float
    cores: int
    overhead_pct: float
    low_pct: float
    high_pct: float


def overhead_at_scale(env: Prediction, baseline: Prediction) -> list[ScaleOverhead]:
    """``env``'s step time over ``baseline``'s, minus one, per core count; the interval
    pairs independent bootstrap replicates of the two (their noise was measured apart)."""
    a, b = env.curve, baseline.curve
    if a.grain_ns != b.grain_ns or [p.cores for p in a.points] != [p.cores for p in b.points]:
        raise UsageError("scale: an overhead needs two predictions of the same grain and cores")
    alpha = (1.0 - a.confidence) / 2.0
    n = min(env.replicates.shape[0], baseline.replicates.shape[0])
    ratio = env.replicates[:n] / baseline.replicates[:n]
    low, high = np.quantile(ratio, [alpha, 1.0 - alpha], axis=0)
    point = env.point / baseline.point
    return [
        ScaleOverhead(
            env=a.env,
            baseline=b.env,
            grain_ns=a.grain_ns,
            cores=p.cores,
            overhead_pct=100.0 * (point[i] - 1.0),
            low_pct=100.0 * (low[i] - 1.0),
            high_pct=100.0 * (high[i] - 1.0),
        )
        for i, p in enumerate(a.points)
    ]
