"""Write a report's files: figures, then ``report.html``, ``report.md``, ``report.json``.

Each file is written to a temporary name in the same directory and renamed into place,
so an interrupted report never leaves a half-written file that looks complete.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hpcvm.bench.results.outdir import check_writable_dir
from hpcvm.report.compare import Comparison
from hpcvm.report.figures import render_compare_figures, render_figures
from hpcvm.report.formats import ReportFormat, get
from hpcvm.report.model import ReportData

FILE_STEM = "report"
COMPARE_STEM = "compare"


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


def check_out_dir(out_dir: Path) -> None:
    """Refuse, before any work, an output path that is not a directory this process can
    write into or make (bench/results/outdir.py says why in one line)."""
    check_writable_dir(out_dir, "--out")


def _formats(out_dir: Path, names: Sequence[str]) -> list[ReportFormat]:
    check_out_dir(out_dir)
    return [get(name) for name in dict.fromkeys(names)]


def write_report(data: ReportData, out_dir: Path, formats: Sequence[str]) -> list[Path]:
    """Write the asked formats (figures first, when one of them shows figures); the
    paths written, figures first."""
    chosen = _formats(out_dir, formats)
    figures = render_figures(data, out_dir) if any(f.figures for f in chosen) else []
    written = [out_dir / f.path for f in figures]
    for fmt in chosen:
        path = out_dir / f"{FILE_STEM}.{fmt.suffix}"
        write_text(path, fmt.render(data, figures, out_dir))
        written.append(path)
    return written


def write_comparison(c: Comparison, out_dir: Path, formats: Sequence[str]) -> list[Path]:
    """Write the comparison in the asked formats (``compare.*``), figures first."""
    chosen = _formats(out_dir, formats)
    figures = render_compare_figures(c, out_dir) if any(f.figures for f in chosen) else []
    written = [out_dir / f.path for f in figures]
    for fmt in chosen:
        path = out_dir / f"{COMPARE_STEM}.{fmt.suffix}"
        write_text(path, fmt.render_compare(c, figures, out_dir))
        written.append(path)
    return written
