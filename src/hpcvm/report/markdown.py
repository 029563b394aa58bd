"""The report as Markdown, for pasting into issues and papers: warnings, environments,
method, one results table per suite (every row) and references to the figure files."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hpcvm.report.compare import Comparison
from hpcvm.report.figures import FigureFile
from hpcvm.report.fmt import (
    TABLE_HEADER,
    change_text,
    compare_significance,
    evidence_tables,
    mean_text,
    method_lines,
    row_cells,
    tuning_text,
)
from hpcvm.report.model import ReportData
from hpcvm.report.scale_tables import scale_intro, scale_tables
from hpcvm.units import human_size


def cell(value: str) -> str:
    """A Markdown table cell: pipes escaped, line breaks flattened."""
    return value.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(cell(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def _environments(data: ReportData) -> list[str]:
    rows = []
    for e in data.envs:
        p = e.plan
        rows.append(
            (
                e.name,
                e.accel,
                e.cpu_model or "-",
                f"{e.vcpus} / {human_size(e.memory_bytes)}",
                "-" if p is None else p.profile,
                "-" if p is None else p.pinning,
                "-" if p is None else "; ".join(p.guest_nodes),
                "-" if p is None else p.memory_backing,
            )
        )
    header = (
        "env",
        "accel",
        "CPU model",
        "vCPUs / memory",
        "profile",
        "pinning",
        "guest nodes",
        "memory backing",
    )
    return ["## Environments", "", *md_table(header, rows)]


def _evidence(data: ReportData) -> list[str]:
    lines: list[str] = []
    for t in evidence_tables(data, ", "):
        lines += [f"## {t.title}", ""]
        if t.intro:
            lines += [t.intro, ""]
        lines += md_table(t.header, t.rows)
    return lines


def _scale(data: ReportData) -> list[str]:
    """``report --scale``: the same tables as the HTML report's "At scale" section
    (report/scale_tables.py builds them for both), then what could not be predicted."""
    if data.scale is None:
        return []
    lines = ["## At scale", "", scale_intro(data.scale), ""]
    for t in scale_tables(data.scale):
        lines += [f"### {t.title}", "", *md_table(t.header, t.rows)]
    lines += [f"> {note}" for note in data.scale.notes]
    return [*lines, ""] if data.scale.notes else lines


def render_markdown(data: ReportData, figures: Sequence[FigureFile]) -> str:
    """The Markdown report; figure paths are relative to the report directory."""
    lines = [f"# hpcvm report: run {data.run.id} of {data.run.results_dir}", ""]
    if data.warnings:
        lines += ["## Warnings", ""]
        tcg_first = sorted(data.warnings, key=lambda w: w.kind != "tcg")
        lines += [f"- **{w.kind.upper()}**: {w.text}" for w in tcg_first] + [""]
    lines += _environments(data)
    lines += ["## Method", "", *[f"- {line}" for line in method_lines(data)], ""]
    for suite in dict.fromkeys(r.suite for r in data.rows):
        lines += [f"## Results: {suite}", ""]
        lines += md_table(TABLE_HEADER, (row_cells(r) for r in data.rows if r.suite == suite))
    lines += _evidence(data)
    lines += _scale(data)
    if figures:
        lines += ["## Figures", ""]
        for f in figures:
            lines += [f"![{f.title}]({f.path})", "", f"*{f.caption}*", ""]
            if f.differs:
                lines += [f"**{f.differs}**", ""]
    lines += [f"> {note}" for note in data.notes]
    return "\n".join(lines).rstrip() + "\n"


COMPARE_HEADER = (
    "benchmark",
    "env",
    "A mean [interval]",
    "B mean [interval]",
    "unit",
    "change B vs A % [interval]",
    "significant",
)


def render_compare_markdown(c: Comparison, figures: Sequence[FigureFile]) -> str:
    """The comparison as Markdown; significant changes in bold."""
    lines = [
        f"# hpcvm comparison: A = run {c.a.run.id} of {c.a.run.results_dir}, "
        f"B = run {c.b.run.id} of {c.b.run.results_dir}",
        "",
    ]
    warnings = [("A", w) for w in c.a.warnings] + [("B", w) for w in c.b.warnings]
    if warnings:
        lines += ["## Warnings", ""]
        lines += [f"- **{side} {w.kind.upper()}**: {w.text}" for side, w in warnings] + [""]
    lines += ["## Method", "", c.method, ""]
    lines += ["## Host tuning when each run started", ""]
    lines += [f"- **{side}**: {tuning_text(d.run.args)}" for side, d in (("A", c.a), ("B", c.b))]
    lines += [""]
    rows = []
    for r in c.rows:
        cells = (
            r.label,
            r.env,
            mean_text(r.a),
            mean_text(r.b),
            r.unit or "-",
            change_text(r),
            compare_significance(r),
        )
        rows.append(tuple(f"**{x}**" for x in cells) if r.significant else cells)
    lines += ["## Comparison", "", *md_table(COMPARE_HEADER, rows)]
    for side, items in (("A", c.only_a), ("B", c.only_b)):
        if items:
            lines += [f"Only in {side}: {'; '.join(items)}", ""]
    for f in figures:
        lines += [f"![{f.title}]({f.path})", "", f"*{f.caption}*", ""]
    return "\n".join(lines).rstrip() + "\n"
