"""Detour statistics of a fixed-work-quanta (FWQ) noise run.

Each quantum does the same work, so its shortest duration is the noise-free work time;
anything above it is a *detour*: time the CPU spent on something else (interrupts, the
scheduler, in a VM also exits to the hypervisor). Operating-system and hypervisor noise
is what the reference studies blame for the poor scaling of fine-grained codes.

A detour *counts* as a noise event when it exceeds ``max(1 µs, 1% of the minimum)``:

- 1 µs is well above the cost of reading the clock (tens of ns natively, a few hundred
  under TCG) and at or below the cost of the smallest real event (an interrupt), so
  clock jitter does not count but every interrupt does;
- the 1% floor keeps the ordinary run-to-run jitter of long quanta (cache and frequency
  effects on memory-bound work) from counting as noise. It hides events under 1% of a
  quantum, so quanta of 100 µs or less see every microsecond-scale event.

Only ``detour_count`` uses the threshold. ``max_detour_ns``, ``p999_detour_ns`` (the
nearest-rank 99.9th percentile: the ceil(0.999 n)-th smallest detour) and
``lost_fraction`` (sum of all detours / sum of all durations) use every quantum, with the
very definitions csrc/noise.c prints, so hpcvm.bench.suites.noise.suite's figures and these agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hpcvm.errors import BenchmarkError
from hpcvm.model import Frozen

ABSOLUTE_THRESHOLD_NS = 1000
RELATIVE_THRESHOLD = 0.01


class NoiseSummary(Frozen):
    """Detours of one CPU's quanta; see the module docstring for the definitions."""

    count: int
    min_ns: int
    threshold_ns: int
    detour_count: int
    max_detour_ns: int
    p999_detour_ns: int
    lost_fraction: float


def detour_threshold_ns(min_ns: int) -> int:
    """The smallest detour that counts as a noise event for quanta of ``min_ns``."""
    return max(ABSOLUTE_THRESHOLD_NS, round(RELATIVE_THRESHOLD * min_ns))


def noise_summary(
    quantum_durations_ns: Sequence[int] | npt.NDArray[Any], threshold_ns: int | None = None
) -> NoiseSummary:
    """Summarise one CPU's quantum durations (nanoseconds, in any order).

    ``threshold_ns`` overrides the default rule ``detour_threshold_ns(min)``.
    """
    d = np.asarray(quantum_durations_ns)
    if d.ndim != 1 or d.size == 0:
        raise BenchmarkError("noise: no quantum durations; check that the noise benchmark ran")
    if not np.issubdtype(d.dtype, np.integer):
        raise BenchmarkError(f"noise: quantum durations must be integer nanoseconds, not {d.dtype}")
    d = d.astype(np.int64)
    if int(d.min()) <= 0:
        raise BenchmarkError("noise: quantum durations must be positive nanoseconds")
    if threshold_ns is not None and threshold_ns < 0:
        raise BenchmarkError(f"noise: detour threshold must be 0 or more, not {threshold_ns}")
    low = int(d.min())
    thr = detour_threshold_ns(low) if threshold_ns is None else threshold_ns
    detours = d - low
    counted = int(np.count_nonzero(detours > thr))
    rank = max(1, -(-999 * int(d.size) // 1000))  # ceil(0.999 n), 1-based nearest rank
    return NoiseSummary(
        count=int(d.size),
        min_ns=low,
        threshold_ns=thr,
        detour_count=counted,
        max_detour_ns=int(detours.max()),
        p999_detour_ns=int(np.sort(detours)[rank - 1]),
        lost_fraction=float(detours.sum()) / float(d.sum()),
    )
