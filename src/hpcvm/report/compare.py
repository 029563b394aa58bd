"""Two result sets side by side: the same env x suite x np x metric in run A and run B,
with the change from A to B and whether it is significant (pure).

The test is the one hpcvm uses for overhead (``hpcvm.stats.overhead``): the ratio of the
two runs' means, B/A for lower-is-better metrics and A/B otherwise, so a positive change
always means "B is worse", with a Fieller interval (Welch degrees of freedom) at the
confidence level of run A. A change is significant when its interval excludes zero; an
unbounded interval (a mean not clearly non-zero) is never significant. The two runs are
independent samples, which is what the interval assumes.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcvm.errors import BenchmarkError
from hpcvm.model import Frozen
from hpcvm.report.labels import label
from hpcvm.report.model import ReportData, Row
from hpcvm.stats import overhead


class CompareRow(Frozen):
    """One metric in both runs; ``change_*`` is B against A in % (positive: B worse)."""

    env: str
    suite: str
    metric: str
    np: int | None
    unit: str
    higher_is_better: bool
    a: Row
    b: Row
    change_pct: float | None
    change_ci_low: float | None
    change_ci_high: float | None
    significant: bool
    note: str = ""

    @property
    def label(self) -> str:
        return label(self.suite, self.metric, self.np)


class Comparison(Frozen):
    """Run A against run B; ``only_a``/``only_b``: rows present in one run only."""

    a: ReportData
    b: ReportData
    confidence: float
    rows: tuple[CompareRow, ...]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]

    @property
    def method(self) -> str:
        level = f"{self.confidence * 100:g}%"
        return (
            "Change of B against A: ratio of the two runs' means (B/A for lower-is-better "
            "metrics, A/B for higher-is-better ones; positive means B is worse) with a "
            f"{level} Fieller interval, Welch degrees of freedom (hpcvm.stats.overhead on "
            "the two runs' samples); significant when the interval excludes zero."
        )


Key = tuple[str, str, int | None, str]


def _key(r: Row) -> Key:
    return (r.env, r.suite, r.np, r.metric)


def _describe(k: Key) -> str:
    env, suite, np_, metric = k
    return f"{env} {label(suite, metric, np_)} ({metric})"


def compare_rows(a: Row, b: Row, confidence: float) -> CompareRow:
    """Compare one metric of two runs; no interval with fewer than 2 values a side."""
    if a.unit != b.unit or a.higher_is_better != b.higher_is_better:
        raise BenchmarkError(
            f"cannot compare {a.metric}: run A has unit {a.unit!r} "
            f"({'higher' if a.higher_is_better else 'lower'} is better), run B {b.unit!r}"
        )
    base = {
        "env": a.env,
        "suite": a.suite,
        "metric": a.metric,
        "np": a.np,
        "unit": a.unit,
        "higher_is_better": a.higher_is_better,
        "a": a,
        "b": b,
    }
    if not a.values or not b.values:
        return CompareRow.model_validate(
            {
                **base,
                "change_pct": None,
                "change_ci_low": None,
                "change_ci_high": None,
                "significant": False,
                "note": "no sample values stored: nothing to compare",
            }
        )
    o = overhead(a.values, b.values, higher_is_better=a.higher_is_better, confidence=confidence)
    return CompareRow.model_validate(
        {
            **base,
            "change_pct": o.overhead_pct,
            "change_ci_low": o.overhead_ci_low,
            "change_ci_high": o.overhead_ci_high,
            "significant": o.significant,
            "note": o.note,
        }
    )


def compare(a: ReportData, b: ReportData) -> Comparison:
    """Match the rows of two reports and compare each pair (order: A's rows)."""
    rows_b = {_key(r): r for r in b.rows}
    keys_a = {_key(r) for r in a.rows}
    confidence = a.run.confidence
    rows = [compare_rows(r, rows_b[_key(r)], confidence) for r in a.rows if _key(r) in rows_b]
    return Comparison(
        a=a,
        b=b,
        confidence=confidence,
        rows=tuple(rows),
        only_a=tuple(_describe(_key(r)) for r in a.rows if _key(r) not in rows_b),
        only_b=tuple(_describe(_key(r)) for r in b.rows if _key(r) not in keys_a),
    )


def significant_rows(c: Comparison) -> Sequence[CompareRow]:
    return [r for r in c.rows if r.significant]
