"""When a printed figure is too coarse to compare: the printing step against the mean.

NPB prints ``Time in seconds`` with two decimals, so a class-S CG that runs 0.04 s is
known to +-0.005 s, 12% of its value, and a run of 0.004 s prints ``0.00``: an
overhead of a few percent cannot show in such figures however many repetitions are
taken (every sample rounds to the same one or two values, and the interval is then
``0 +- 0`` or meaningless). Pure: the caller passes the samples and the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

# The step must be at most this fraction of the mean: 1%, the default --target, so the
# rounding alone cannot take the whole error budget of an auto run.
DEFAULT_LIMIT = 0.01


def coarse_resolution(
    values: Sequence[float], resolution: float, *, limit: float = DEFAULT_LIMIT
) -> bool:
    """True when ``resolution`` (the printing step) exceeds ``limit`` times the mean
    magnitude of ``values``, or the values are all zero; False without values."""
    if not values or resolution <= 0:
        return False
    mean = abs(fmean(values))
    return mean == 0 or resolution > limit * mean


def resolution_warning(
    label: str,
    values: Sequence[float],
    resolution: float,
    unit: str,
    advice: str,
    *,
    limit: float = DEFAULT_LIMIT,
) -> str | None:
    """One line for the user when ``coarse_resolution``; None otherwise. ``label`` says
    which figure ("CG time, np 1"), ``advice`` what to do about it."""
    if not coarse_resolution(values, resolution, limit=limit):
        return None
    mean = abs(fmean(values))
    step = f"{resolution:g} {unit}".strip()
    if mean == 0:
        size = f"every sample printed as 0 (below the {step} step)"
    else:
        size = f"printed in steps of {step}, {resolution / mean:.0%} of its mean {mean:.3g} {unit}"
    return f"{label}: {size.strip()}, too coarse to compare at {limit:.0%}: {advice}"
