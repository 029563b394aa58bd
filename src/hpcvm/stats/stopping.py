"""When to stop repeating: a fixed-width sequential rule (Chow and Robbins, 1965).

``--reps auto`` runs at least ``n_min`` repetitions (3 or more: fewer give an interval
too wide to mean anything and a standard deviation too unstable to stop on), then stops
at the first n where, for every metric,

    t(1 - alpha/2, n - 1) * s / sqrt(n) <= target * |mean|

or when the repetition or time cap is reached. It stops on the *width* of the interval,
never on a p-value: peeking at significance after every run inflates false positives,
while a width rule does not depend on the effect being measured. The caps are checked
only after ``n_min`` so every result has a usable interval.

Chow and Robbins' original rule adds 1/n to s^2 so that a lucky small s at tiny n
cannot stop early; ``n_min`` >= 3 plays that part here, as METHOD.md specifies.

Two refinements for a run whose cells cost very different amounts (a native sample of
two seconds beside a TCG guest's thirty):

- **Extreme statistics are left out.** A per-sample maximum or 99.9th percentile (the
  noise suite's detours) is dominated by the rarest event of each sample; the mean of
  such values has an interval, but more repetitions barely narrow it, so a rule that
  waited for it would always run into its caps. The caller names those metrics
  (``extreme``, data on the suite's Metric); the decision lists them in ``left_out``.
- **A cell that cannot make it gives way.** Given the seconds one repetition costs, the
  rule projects the repetitions the target needs (the smallest n* with
  t(n*-1)*s/sqrt(n*) <= target*|mean| at today's relative s). When n* lies beyond the
  repetition cap, or min(n*, n_max) of them cannot fit in the time left once the cells
  that are cheaper to finish have had what they need (the caller adds that up,
  ``reserved``), the decision says ``give_way``: the caller runs the cells that can
  still make it first and this one with whatever time then remains, so a native cell
  of two seconds reaches its target before a guest cell of thirty seconds spends the
  cap on a target it could not reach anyway. It never stops a cell by itself (when
  every open cell gives way, the caller runs them all: time nobody else needs is still
  spent narrowing intervals), and it uses the width only, like the rule itself, never
  the effect.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Literal

import numpy as np
from scipy.stats import norm

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.model import Frozen
from hpcvm.stats._checks import Sample, check_confidence, finite_sample
from hpcvm.stats.summary import DEFAULT_CONFIDENCE, t_quantile

MAX_PROJECTED = 1_000_000  # repetitions: beyond this a target counts as out of reach
Reason = Literal["target", "max-reps", "max-time", "continue"]


class StopDecision(Frozen):
    """Whether to stop, which rule decided, and the metric furthest from the target.

    ``worst_relative_half_width`` is half-width / |mean| of ``worst_metric`` (infinite
    while a metric has fewer than 2 samples); ``n`` is the repetitions counted so far.
    """

    stop: bool
    reason: Reason
    n: int
    worst_metric: str
    worst_relative_half_width: float
    left_out: tuple[str, ...] = ()  # extreme statistics the rule did not judge
    # not stopping, but the target (or the cap) does not fit in the time left beside the
    # cheaper cells' needs: run them first, and this cell with whatever time remains
    give_way: bool = False


def relative_half_width(values: Sample, confidence: float) -> float:
    """t*s/sqrt(n) / |mean|; infinite below 2 samples or for a zero mean with spread."""
    if len(values) == 0:
        return math.inf
    arr = finite_sample(values, "stopping rule")
    if arr.size < 2:
        return math.inf
    half = t_quantile(confidence, arr.size - 1) * float(arr.std(ddof=1)) / math.sqrt(arr.size)
    mean = abs(float(arr.mean()))
    if half == 0.0:
        return 0.0
    return half / mean if mean > 0.0 else math.inf


def _check_rule(target: float, n_min: int, n_max: int, max_time: float | None) -> None:
    if not 0.0 < target < 1.0 or math.isnan(target):
        raise UsageError(
            f"target must be a fraction of the mean in (0, 1), e.g. 0.01, not {target}"
        )
    if n_min < 2:
        raise UsageError(f"minimum repetitions must be at least 2 for an interval, not {n_min}")
    if n_max < n_min:
        raise UsageError(f"maximum repetitions {n_max} is below the minimum {n_min}")
    if max_time is not None and not max_time > 0.0:
        raise UsageError(f"time cap must be positive seconds, not {max_time}")


def repetitions_needed(relative_width: float, n: int, target: float, confidence: float) -> float:
    """The smallest n* >= n at which a sample with today's relative standard deviation
    (recovered from the relative half-width at n) would meet ``target``, t falling with
    n as it does. Infinite for an infinite width or beyond a million repetitions."""
    if not math.isfinite(relative_width):
        return math.inf
    if relative_width <= target:
        return float(n)
    cv = relative_width * math.sqrt(n) / t_quantile(confidence, n - 1)
    z = float(norm.ppf(0.5 + confidence / 2.0))
    m = max(n, math.ceil((z * cv / target) ** 2))  # t > z: never past the answer
    while m <= MAX_PROJECTED and t_quantile(confidence, m - 1) * cv / math.sqrt(m) > target:
        m += max(1, m // 100)
    return float(m) if m <= MAX_PROJECTED else math.inf


def projected_seconds(
    samples_by_metric: Mapping[str, Sample],
    *,
    target: float,
    confidence: float = DEFAULT_CONFIDENCE,
    n: int,
    n_max: int,
    seconds_per_rep: float,
    extreme: Collection[str] = (),
) -> float:
    """Seconds a cell still needs to reach its target or, when that lies beyond it, its
    repetition cap: (min(n*, n_max) - n) repetitions at ``seconds_per_rep``; infinite
    while a judged metric has fewer than 2 values."""
    judged = [v for k, v in samples_by_metric.items() if k not in extreme]
    if not judged:
        return math.inf
    worst = max(relative_half_width(v, confidence) for v in judged)
    wanted = min(repetitions_needed(worst, max(n, 2), target, confidence), float(n_max))
    return max(0.0, wanted - n) * seconds_per_rep


def fixed_width_stop(
    samples_by_metric: Mapping[str, Sample],
    *,
    target: float,
    confidence: float = DEFAULT_CONFIDENCE,
    n_min: int = 3,
    n_max: int,
    elapsed: float,
    max_time: float | None,
    reps: int | None = None,
    extreme: Collection[str] = (),
    seconds_per_rep: float | None = None,
    reserved: float = 0.0,
) -> StopDecision:
    """Decide after a repetition whether ``--reps auto`` should stop.

    ``target`` is the relative half-width wanted (0.01 for 1%); ``elapsed`` and
    ``max_time`` are seconds (``max_time=None``: no time cap). ``reps`` is how many
    repetitions have run; by default the longest sample, so a metric whose runs failed
    (fewer samples) cannot keep the rule from reaching its caps. Metrics named in
    ``extreme`` are not judged (listed in ``left_out``); with ``seconds_per_rep`` (what
    one more repetition costs) a cell whose target lies beyond its repetition cap, or
    cannot be reached in the time left once ``reserved`` seconds are set aside for the
    cells that need less time than this one to finish, is told to ``give_way`` (see the
    module doc).
    """
    conf = check_confidence(confidence)
    _check_rule(target, n_min, n_max, max_time)
    judged = {k: v for k, v in samples_by_metric.items() if k not in extreme}
    if not judged:
        raise BenchmarkError(
            "stopping rule: no metrics to judge (none measured, or all are extreme "
            "statistics); check that the runs succeeded"
        )
    widths = {name: relative_half_width(v, conf) for name, v in judged.items()}
    worst = max(widths, key=lambda name: widths[name])
    fewest = min(len(v) for v in judged.values())
    n = reps if reps is not None else max(len(v) for v in samples_by_metric.values())
    reason: Reason = "continue"
    give_way = False
    if n >= n_min:
        if fewest >= n_min and widths[worst] <= target:
            reason = "target"
        elif n >= n_max:
            reason = "max-reps"
        elif max_time is not None and elapsed >= max_time:
            reason = "max-time"
        elif seconds_per_rep is not None:
            needed = repetitions_needed(widths[worst], n, target, conf)
            left = None if max_time is None else max_time - elapsed - reserved
            cost = (min(needed, float(n_max)) - n) * seconds_per_rep
            give_way = needed > n_max or (left is not None and cost > left)
    return StopDecision(
        stop=reason != "continue",
        reason=reason,
        n=n,
        worst_metric=worst,
        worst_relative_half_width=widths[worst],
        left_out=tuple(sorted(k for k in samples_by_metric if k in extreme)),
        give_way=give_way,
    )


class Replay(Frozen):
    """What ``auto`` would have done on a recorded sequence of repetitions."""

    decision: StopDecision
    relative_half_width_at_stop: dict[str, float]
    relative_half_width_at_end: dict[str, float]
    n_available: int


def replay_auto(
    samples_by_metric: Mapping[str, Sample],
    *,
    target: float,
    confidence: float = DEFAULT_CONFIDENCE,
    n_min: int = 3,
    n_max: int | None = None,
) -> Replay:
    """Replay the rule on samples in the order they were taken (no time cap).

    For comparing ``auto`` with a fixed number of runs on real data: the repetitions it
    would have spent, the interval widths it would have reported, and the widths that
    all available runs give. Metrics must have equal lengths (one value per repetition).
    If the target is never met, the decision is ``max-reps`` at ``n_max`` (default: all
    available runs).
    """
    lengths = {len(v) for v in samples_by_metric.values()}
    if len(lengths) != 1:
        raise BenchmarkError("replay needs the same number of samples for every metric")
    available = lengths.pop()
    cap = available if n_max is None else min(n_max, available)
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in samples_by_metric.items()}
    decision: StopDecision | None = None
    for n in range(1, cap + 1):
        decision = fixed_width_stop(
            {k: a[:n] for k, a in arrays.items()},
            target=target,
            confidence=confidence,
            n_min=n_min,
            n_max=max(cap, n_min),
            elapsed=0.0,
            max_time=None,
        )
        if decision.stop:
            break
    if decision is None:
        raise BenchmarkError("replay needs at least one repetition")
    stop_n = decision.n
    return Replay(
        decision=decision,
        relative_half_width_at_stop={
            k: relative_half_width(a[:stop_n], confidence) for k, a in arrays.items()
        },
        relative_half_width_at_end={
            k: relative_half_width(a, confidence) for k, a in arrays.items()
        },
        n_available=available,
    )
