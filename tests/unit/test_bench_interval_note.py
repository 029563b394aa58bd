"""The "too noisy to trust" note is for an interval that crosses zero while every
sample is positive (time, rate); a metric whose samples are themselves negative (a
user's --cmd metric, e.g. a clock offset) is not flagged for being what it is."""

from __future__ import annotations

from hpcvm.bench.results.results import summarize_run
from tests.unit.test_bench_failures import NATIVE, RUN, _sample


def _row(values: list[float]):  # type: ignore[no-untyped-def]
    samples = [_sample(i, "native", ok=True, metrics={"q": v}) for i, v in enumerate(values, 1)]
    (row,) = summarize_run(RUN, [NATIVE], samples)
    return row


def test_positive_samples_with_an_interval_below_zero_are_flagged() -> None:
    row = _row([1.0, 0.05, 0.05, 0.05])
    assert row.ci_low is not None and row.ci_low < 0
    assert "every sample is positive" in row.interval_note


def test_a_metric_with_negative_samples_is_not_flagged() -> None:
    row = _row([1.0, -0.4, 0.3, -0.2, 0.5])
    assert row.ci_low is not None and row.ci_low < 0 < row.mean  # type: ignore[operator]
    assert row.interval_note == ""
    assert not any("too noisy" in w for w in row.warnings)
