"""The "At scale" section's text and tables (``report --scale``), built once as rows so
that every format (HTML, Markdown, the terminal's verdict lines) lays out the same
numbers and can never disagree; the numbers themselves come from ``report/scale.py``.
"""

from __future__ import annotations

from hpcvm.report.fmt import EvidenceTable
from hpcvm.report.model import ScaleMeasured, ScaleReport

CHECK_TITLE = "Prediction checked against the bsp suite"
OVERHEAD_TITLE = "Predicted overhead against native (%)"
SLOWDOWN_TITLE = "Predicted slowdown against a quiet machine (%)"
CHECK_HEADER = ("env", "np", "grain (us)", "measured slowdown %", "predicted %", "agrees")
VERDICT = {True: "yes", False: "no", None: "-"}


def span(value: float, low: float, high: float) -> str:
    """A value and its interval, signed: ``+1.23 [+0.45, +2.01]``."""
    return f"{value:+.2f} [{low:+.2f}, {high:+.2f}]"


def scale_columns(scale: ScaleReport) -> list[int]:
    """The tables' core counts: those asked for and the run's own."""
    return sorted({scale.ran, *scale.asked})


def _cores_head(scale: ScaleReport) -> list[str]:
    return [f"{c:,} cores" + (" (ran)" if c == scale.ran else "") for c in scale_columns(scale)]


def scale_intro(scale: ScaleReport) -> str:
    """The sentence before the tables: the model in one line, the bootstrap's size and
    each environment's collective latency with its source."""
    first = scale.curves[0] if scale.curves else None
    how = (
        f"The expected step is exact over the pooled traces; its "
        f"{first.confidence * 100:g}% interval is from {first.resamples} bootstrap "
        "replicates of the measured traces"
        if first
        else "no environment could be predicted (see the notes)"
    )
    latency = "; ".join(
        f"{x.env}: {x.latency_ns / 1e3:.3g} us ({x.source})" for x in scale.latencies
    )
    return (
        "A bulk-synchronous code: every rank computes a grain of work, then all meet in a "
        "collective; a step lasts as long as its slowest rank plus the collective "
        "(latency x ceil(log2 cores)). Each rank's delay per step is drawn from the "
        f"environment's own measured noise quanta (docs/scale.md). {how}. The run itself "
        f"had {scale.ran} CPU(s) per noise run. Collective latency per stage: {latency}."
    )


def measured_interval(m: ScaleMeasured) -> str:
    """The bsp measurement with its interval where it has one."""
    if m.low_pct is None or m.high_pct is None:
        return f"{m.slowdown_pct:+.2f}"
    return span(m.slowdown_pct, m.low_pct, m.high_pct)


def predicted_interval(m: ScaleMeasured) -> str:
    """The prediction beside a bsp measurement, or "-" where none could be made."""
    if m.predicted_pct is None or m.predicted_low_pct is None or m.predicted_high_pct is None:
        return "-"
    return span(m.predicted_pct, m.predicted_low_pct, m.predicted_high_pct)


def check_rows(scale: ScaleReport) -> tuple[tuple[str, ...], ...]:
    """One row per bsp measurement (environment and rank count): measured and predicted
    slowdown with their intervals, and whether the two intervals meet."""
    return tuple(
        (
            m.env,
            str(m.cores),
            f"{m.grain_ns / 1e3:.3g}",
            measured_interval(m),
            predicted_interval(m),
            VERDICT[m.contained],
        )
        for m in scale.measured
    )


def measured_text(scale: ScaleReport, env: str, grain: float, overhead: bool) -> str:
    """What bsp measured at this grain, per rank count: against native (overhead) or
    against the quiet step, then with the prediction's interval and whether it holds it."""
    parts = []
    for m in scale.measured:
        if m.env != env or scale.grain_of(m) != grain:
            continue
        if overhead:
            if m.overhead_pct is not None:
                parts.append(f"np {m.cores}: {m.overhead_pct:+.2f}")
            continue
        said = f"np {m.cores}, grain {m.grain_ns / 1e3:.3g} us: {m.slowdown_pct:+.2f}"
        if m.predicted_low_pct is not None and m.predicted_high_pct is not None:
            agrees = "agrees with" if m.contained else "DISAGREES with"
            said += f" ({agrees} [{m.predicted_low_pct:+.2f}, {m.predicted_high_pct:+.2f}])"
        parts.append(said)
    return "; ".join(parts) or "-"


def _overhead_table(scale: ScaleReport) -> EvidenceTable:
    cols = scale_columns(scale)
    rows = []
    for env in dict.fromkeys(o.env for o in scale.overheads):
        for grain in scale.grains_ns:
            mine = {o.cores: o for o in scale.overheads if o.env == env and o.grain_ns == grain}
            if mine:
                cells = [
                    span(mine[c].overhead_pct, mine[c].low_pct, mine[c].high_pct) for c in cols
                ]
                rows.append(
                    (env, f"{grain / 1e3:g}", *cells, measured_text(scale, env, grain, True))
                )
    head = ("env", "grain (us)", *_cores_head(scale), "measured (bsp)")
    return EvidenceTable(
        title=OVERHEAD_TITLE,
        intro="",
        header=head,
        rows=tuple(rows),
        numeric=frozenset(range(2, len(head) - 1)),
    )


def _slowdown_table(scale: ScaleReport) -> EvidenceTable:
    cols = scale_columns(scale)
    rows = []
    for c in scale.curves:
        by = {p.cores: p for p in c.points}
        cells = [
            span(by[k].slowdown_pct, by[k].slowdown_low_pct, by[k].slowdown_high_pct) for k in cols
        ]
        rows.append(
            (
                c.env,
                f"{c.grain_ns / 1e3:g}",
                str(c.traces),
                *cells,
                measured_text(scale, c.env, c.grain_ns, False),
            )
        )
    head = ("env", "grain (us)", "traces", *_cores_head(scale), "measured (bsp)")
    return EvidenceTable(
        title=SLOWDOWN_TITLE,
        intro="",
        header=head,
        rows=tuple(rows),
        numeric=frozenset(range(2, len(head) - 1)),
    )


def scale_tables(scale: ScaleReport) -> list[EvidenceTable]:
    """The section's tables in order: the check against bsp (when bsp ran), each VM's
    predicted overhead against native (when both were predicted), every environment's
    predicted slowdown."""
    tables = []
    if scale.measured:
        tables.append(
            EvidenceTable(
                title=CHECK_TITLE,
                intro="",
                header=CHECK_HEADER,
                rows=check_rows(scale),
                numeric=frozenset({1, 2}),
            )
        )
    if scale.overheads:
        tables.append(_overhead_table(scale))
    tables.append(_slowdown_table(scale))
    return tables
