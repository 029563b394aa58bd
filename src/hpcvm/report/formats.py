"""Registry: report format name (as typed after ``--format``) -> how to write it.

A format is one object: the file suffix, whether it shows the PNG figures (then they
are drawn first), and two renderers, one for a run and one for two runs compared.
Adding a format is one module that builds a ReportFormat and one ``register`` call (in
hpcvm, or from a plugin: see hpcvm/plugins.py); ``--format`` offers exactly the
registered names, and an unknown name is a one-line UsageError, never a fallback.
Renderers are imported when a format is written, so listing the formats (``--help``)
loads no report code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpcvm.registry import Registry

if TYPE_CHECKING:
    from hpcvm.report.compare import Comparison
    from hpcvm.report.figures import FigureFile
    from hpcvm.report.model import ReportData

JSON_SCHEMA = "hpcvm-report/1"

RenderRun = Callable[["ReportData", Sequence["FigureFile"], Path], str]
RenderCompare = Callable[["Comparison", Sequence["FigureFile"], Path], str]


@dataclass(frozen=True)
class ReportFormat:
    """One output format of ``hpcvm report``: ``report.<suffix>`` / ``compare.<suffix>``."""

    name: str
    suffix: str
    figures: bool  # draws the PNG figures it refers to
    render: RenderRun
    render_compare: RenderCompare
    description: str = ""


FORMATS: Registry[ReportFormat] = Registry("report format")


def register(fmt: ReportFormat) -> None:
    """Add a format; a second format of the same name is a mistake, not an override."""
    FORMATS.register(fmt.name, fmt)


def get(name: str) -> ReportFormat:
    """The format called ``name``; UsageError naming the known ones otherwise."""
    return FORMATS.get_or_refuse(name)


def report_json(data: ReportData, figures: Sequence[FigureFile], _out: Path) -> str:
    return json.dumps(
        {
            "schema": JSON_SCHEMA,
            "report": data.model_dump(mode="json"),
            "figures": [f.model_dump(mode="json") for f in figures],
        },
        indent=1,
    )


def compare_json(c: Comparison, figures: Sequence[FigureFile], _out: Path) -> str:
    rows = [
        {
            **r.model_dump(mode="json", exclude={"a", "b"}),
            "a": r.a.model_dump(mode="json", exclude={"values"}),
            "b": r.b.model_dump(mode="json", exclude={"values"}),
        }
        for r in c.rows
    ]
    return json.dumps(
        {
            "schema": JSON_SCHEMA,
            "method": c.method,
            "confidence": c.confidence,
            "a": {
                "run": c.a.run.model_dump(mode="json"),
                "warnings": [w.text for w in c.a.warnings],
            },
            "b": {
                "run": c.b.run.model_dump(mode="json"),
                "warnings": [w.text for w in c.b.warnings],
            },
            "rows": rows,
            "only_a": list(c.only_a),
            "only_b": list(c.only_b),
            "figures": [f.model_dump(mode="json") for f in figures],
        },
        indent=1,
    )


def _html(data: ReportData, figures: Sequence[FigureFile], out: Path) -> str:
    from hpcvm.report.html import render_html

    return render_html(data, figures, out)


def _html_compare(c: Comparison, figures: Sequence[FigureFile], out: Path) -> str:
    from hpcvm.report.html import render_compare_html

    return render_compare_html(c, figures, out)


def _markdown(data: ReportData, figures: Sequence[FigureFile], _out: Path) -> str:
    from hpcvm.report.markdown import render_markdown

    return render_markdown(data, figures)


def _markdown_compare(c: Comparison, figures: Sequence[FigureFile], _out: Path) -> str:
    from hpcvm.report.markdown import render_compare_markdown

    return render_compare_markdown(c, figures)


register(
    ReportFormat(
        name="html",
        suffix="html",
        figures=True,
        render=_html,
        render_compare=_html_compare,
        description="one self-contained page with the figures embedded",
    )
)
register(
    ReportFormat(
        name="md",
        suffix="md",
        figures=True,
        render=_markdown,
        render_compare=_markdown_compare,
        description="Markdown for issues and papers, figures as PNG files beside it",
    )
)
register(
    ReportFormat(
        name="json",
        suffix="json",
        figures=False,
        render=report_json,
        render_compare=compare_json,
        description="the report's data, versioned",
    )
)
