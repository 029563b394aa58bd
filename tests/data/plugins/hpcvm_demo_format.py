"""A throw-away report format registered from outside hpcvm (tests/unit/test_plugins.py):
one module, one registry call."""

from collections.abc import Sequence
from pathlib import Path

from hpcvm.report import ReportData, ReportFormat, register
from hpcvm.report.figures import FigureFile


def _rows(data: ReportData, figures: Sequence[FigureFile], out_dir: Path) -> str:
    return "".join(f"{r.env}\t{r.metric}\t{r.mean}\n" for r in data.rows)


register(
    ReportFormat(
        name="tsv",
        suffix="tsv",
        figures=False,
        render=_rows,
        render_compare=lambda c, figures, out_dir: "".join(f"{r.metric}\n" for r in c.rows),
        description="one line per row (a test plugin)",
    )
)
