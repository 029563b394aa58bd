"""Summary rows of a run for the report: ``hpcvm results``' rows plus what figures need.

The numbers are ``hpcvm.bench.results.results.summarize_run``'s, so the report and
``hpcvm results`` always agree. Two additions (pure):

- the values behind each mean (``--compare`` computes its own interval from them);
- the overhead's point estimate where no finite interval exists (fewer than 2 values on
  a side, or Fieller's set unbounded): ``hpcvm results`` leaves ``overhead_pct`` empty
  there; the report keeps the ratio of means and shows the interval as unbounded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from hpcvm.bench.results.results import NATIVE, ResultRow, summarize_run
from hpcvm.report.model import Row
from hpcvm.store import EnvironmentRecord, RunRecord, SampleRecord

ValueKey = tuple[str, str, int | None, str]  # env, suite, np, metric


def tcg_warning(env: str) -> str:
    return (
        f"{env} ran under TCG (software emulation): its overhead shows emulation, "
        "not hardware virtualization"
    )


def sample_values(samples: Sequence[SampleRecord]) -> dict[ValueKey, list[float]]:
    """Values of the measured (non-warm-up, ok) samples per env, suite, np and metric,
    in the order taken: the same values results.py summarises."""
    values: dict[ValueKey, list[float]] = defaultdict(list)
    for s in samples:
        if s.warmup or not s.ok:
            continue
        for m in s.metrics:
            if m.value is not None:
                values[(s.env, s.suite, s.np, m.metric)].append(m.value)
    return values


def point_overhead(native_mean: float, mean: float, higher_is_better: bool) -> float | None:
    """Overhead % from two means (hpcvm.stats' definition), None when undefined."""
    num, den = (native_mean, mean) if higher_is_better else (mean, native_mean)
    return None if den == 0.0 else (num / den - 1.0) * 100.0


def to_row(r: ResultRow, values: Sequence[float], native: ResultRow | None) -> Row:
    # Only the fields the report carries: the run id and confidence are the run's, and a
    # field results.py gains later must not break reports.
    fields = {k: v for k, v in r.model_dump().items() if k in Row.model_fields}
    fields["values"] = tuple(values)
    if (
        r.env != NATIVE
        and r.overhead_pct is None
        and r.mean is not None
        and native is not None
        and native.mean is not None
    ):
        fields["overhead_pct"] = point_overhead(native.mean, r.mean, r.higher_is_better)
    return Row.model_validate(fields)


def summary_rows(
    run: RunRecord, envs: Sequence[EnvironmentRecord], samples: Sequence[SampleRecord]
) -> list[Row]:
    """The run's rows in results.py's order (suite, np, metric, then environment)."""
    results = summarize_run(run, envs, samples)
    values = sample_values(samples)
    natives = {(r.suite, r.np, r.metric): r for r in results if r.env == NATIVE}
    return [
        to_row(
            r,
            values.get((r.env, r.suite, r.np, r.metric), []),
            natives.get((r.suite, r.np, r.metric)),
        )
        for r in results
    ]
