"""Input checks shared by the statistics functions.

Statistics over an empty or non-finite sample would silently produce NaN that then
propagates into tables and JSON; failing early with a one-line message names the
culprit instead (usually every sample of a metric failed or a parser let a NaN through).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hpcvm.errors import BenchmarkError, UsageError

Sample = Sequence[float] | npt.NDArray[Any]
"""What the statistics functions accept: a list/tuple of numbers or a 1-D numpy array."""


def check_confidence(confidence: float) -> float:
    """Return ``confidence`` if it is a probability strictly between 0 and 1."""
    if not 0.0 < confidence < 1.0:
        raise UsageError(
            f"confidence must lie strictly between 0 and 1 (e.g. 0.97), got {confidence}"
        )
    return float(confidence)


def finite_sample(values: Sample, what: str) -> npt.NDArray[np.float64]:
    """The values as a float64 array; refuse an empty sample or NaN/inf values."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise BenchmarkError(f"{what}: expected a flat sequence of numbers, got shape {arr.shape}")
    if arr.size == 0:
        raise BenchmarkError(f"{what}: no samples to summarise; check that the runs succeeded")
    if not np.all(np.isfinite(arr)):
        raise BenchmarkError(
            f"{what}: samples contain NaN or infinity; check the benchmark's output"
        )
    return arr
