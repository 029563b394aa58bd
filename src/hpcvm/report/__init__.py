"""report stage of the hpcvm pipeline (see DESIGN.md): the reference studies' figures,
a self-contained HTML page, Markdown and JSON of one run, and two runs compared.

``load_report(results_dir)`` reads a run into a ``ReportData`` (model.py); every output
is a function of it: ``write_report(data, out_dir, formats)``; ``compare(a, b)`` and
``write_comparison(comparison, out_dir, formats)`` for ``--compare``.
"""

from typing import TYPE_CHECKING

from hpcvm.lazy import lazy_exports

if TYPE_CHECKING:
    from hpcvm.report.compare import CompareRow, Comparison, compare
    from hpcvm.report.formats import FORMATS, ReportFormat, register
    from hpcvm.report.load import build_report, load_report
    from hpcvm.report.model import ReportData, Row
    from hpcvm.report.write import write_comparison, write_report

__all__ = [
    "FORMATS",
    "CompareRow",
    "Comparison",
    "ReportData",
    "ReportFormat",
    "Row",
    "build_report",
    "compare",
    "load_report",
    "register",
    "write_comparison",
    "write_report",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "hpcvm.report.compare": ("CompareRow", "Comparison", "compare"),
        "hpcvm.report.formats": ("FORMATS", "ReportFormat", "register"),
        "hpcvm.report.load": ("build_report", "load_report"),
        "hpcvm.report.model": ("ReportData", "Row"),
        "hpcvm.report.write": ("write_comparison", "write_report"),
    },
)
