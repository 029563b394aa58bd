"""What a benchmark run yields: named values with a unit and a direction.

A metric's direction matters downstream: overhead against native is mean_vm/mean_native
for lower-is-better metrics and its inverse for higher-is-better ones, so each value
carries its definition instead of leaving the statistics to guess from the name.

Two levels of failure, kept apart on purpose:
- the whole run failed (non-zero exit, missing or truncated output, a benchmark's own
  failure flag): the suite's ``parse`` raises :class:`ParseError` and the orchestrator
  records a failed sample with its log;
- one figure of an otherwise good run is unusable (``inf``/``nan``, missing from a
  complete summary): a :class:`MetricValue` with ``value=None`` and the reason.
"""

from __future__ import annotations

import math

from pydantic import model_validator

from hpcvm.errors import BenchmarkError
from hpcvm.model import Frozen


class ParseError(BenchmarkError):
    """A benchmark run failed or printed output that cannot be read: a failed sample."""


class Metric(Frozen):
    """Definition of one figure a suite reports."""

    name: str
    unit: str
    higher_is_better: bool
    description: str = ""
    short: str = ""  # the label of the studies' figures ("HPL", "RA MPI"); "" for none
    # An extreme statistic (a maximum, a p99.9) of each sample: its mean over samples has
    # an interval, but no repetition count narrows it to a target, so a stopping rule
    # leaves it out of its judgement.
    extreme: bool = False
    # The message size this figure was measured at (latency/bandwidth curves), for the
    # report's figures against message size; None for figures without one.
    message_bytes: int | None = None
    # Bound by memory access (bandwidth or latency to RAM, TLB reach), as STREAM and
    # RandomAccess are: the figures most sensitive to page sizes, which the report's
    # page-size figure draws.
    memory_bound: bool = False

    def value(self, value: float) -> MetricValue:
        """This metric measured as ``value``; a non-finite value is a failed metric."""
        if not math.isfinite(value):
            return self.failed(f"{self.name} is {value!r} (not a finite number)")
        return MetricValue(metric=self, value=value)

    def failed(self, reason: str) -> MetricValue:
        """This metric could not be measured in an otherwise readable run."""
        return MetricValue(metric=self, value=None, error=reason)


class MetricValue(Frozen):
    """One measured figure (or the reason it is missing) of one run."""

    metric: Metric
    value: float | None
    error: str | None = None

    @model_validator(mode="after")
    def _value_xor_error(self) -> MetricValue:
        if (self.value is None) == (self.error is None):
            raise ValueError("a MetricValue has either a finite value or an error, not both")
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"{self.metric.name}: value must be finite, got {self.value!r}")
        return self

    @property
    def name(self) -> str:
        return self.metric.name

    @property
    def ok(self) -> bool:
        return self.value is not None


def parse_number(text: str) -> float:
    """Read a number as C's printf prints it: ``%g`` (``1e-05``, ``0.00477206``),
    ``%f``, ``%e``, integers, and glibc's ``inf``/``-inf``/``nan``/``-nan``.

    Raises ValueError for anything else. Non-finite results are returned as such;
    :meth:`Metric.value` turns them into a failed metric.
    """
    cleaned = text.strip()
    if not cleaned or "_" in cleaned:  # float() accepts "1_000"; printf never prints it
        raise ValueError(f"not a number: {text!r}")
    return float(cleaned)


def tail(text: str, lines: int = 5) -> str:
    """The last non-empty lines of a program's output, joined on one line for an error
    message (messages are one line by project rule)."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])
