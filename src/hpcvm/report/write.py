"""Write a report's files: figures, then ``report.html``, ``report.md``, ``report.json``.

Each file is written to a temporary name in the same directory and renamed into place,
so an interrupted report never leaves a half-written file that looks complete.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from hpcvm.errors import UsageError
from hpcvm.report.compare import Comparison
from hpcvm.report.figures import FigureFile, render_compare_figures, render_figures
from hpcvm.report.html import render_compare_html, render_html
from hpcvm.report.markdown import render_compare_markdown, render_markdown
from hpcvm.report.model import ReportData

Format = Literal["html", "md", "json"]
FORMATS: tuple[Format, ...] = ("html", "md", "json")
FILE_NAMES: dict[Format, str] = {"html": "report.html", "md": "report.md", "json": "report.json"}
COMPARE_NAMES: dict[Format, str] = {
    "html": "compare.html",
    "md": "compare.md",
    "json": "compare.json",
}
JSON_SCHEMA = "hpcvm-report/1"


def _umask() -> int:
    """The process umask (read by setting it, then putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: Path, content: str) -> None:
    """Replace ``path`` with ``content`` atomically (temp file in the same directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
            # mkstemp makes the file 0600; a report is read like the rest of the
            # results (by the user's group, a web server), so give it the umask's mode
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def report_json(data: ReportData, figures: Sequence[FigureFile]) -> str:
    return json.dumps(
        {
            "schema": JSON_SCHEMA,
            "report": data.model_dump(mode="json"),
            "figures": [f.model_dump(mode="json") for f in figures],
        },
        indent=1,
    )


def check_out_dir(out_dir: Path) -> None:
    """Refuse an output path that exists and is not a directory, before any work."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} exists and is not a directory: choose another path")


def _check(out_dir: Path, formats: Sequence[str]) -> None:
    check_out_dir(out_dir)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise UsageError(f"unknown report format {unknown[0]!r}; use html, md or json")


def write_report(data: ReportData, out_dir: Path, formats: Sequence[Format]) -> list[Path]:
    """Write the asked formats (figures too when html or md is asked); the paths written,
    figures first."""
    _check(out_dir, formats)
    figures = render_figures(data, out_dir) if {"html", "md"} & set(formats) else []
    written = [out_dir / f.path for f in figures]
    for fmt in dict.fromkeys(formats):
        path = out_dir / FILE_NAMES[fmt]
        if fmt == "html":
            write_text(path, render_html(data, figures, out_dir))
        elif fmt == "md":
            write_text(path, render_markdown(data, figures))
        else:
            write_text(path, report_json(data, figures))
        written.append(path)
    return written


def compare_json(c: Comparison, figures: Sequence[FigureFile]) -> str:
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


def write_comparison(c: Comparison, out_dir: Path, formats: Sequence[Format]) -> list[Path]:
    """Write the comparison in the asked formats (``compare.*``), figures first."""
    _check(out_dir, formats)
    figures = render_compare_figures(c, out_dir) if {"html", "md"} & set(formats) else []
    written = [out_dir / f.path for f in figures]
    for fmt in dict.fromkeys(formats):
        path = out_dir / COMPARE_NAMES[fmt]
        if fmt == "html":
            write_text(path, render_compare_html(c, figures, out_dir))
        elif fmt == "md":
            write_text(path, render_compare_markdown(c, figures))
        else:
            write_text(path, compare_json(c, figures))
        written.append(path)
    return written
