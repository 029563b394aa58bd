"""`hpcvm report`: the figures, HTML, Markdown and JSON of a results directory, or two
result sets compared side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcvm.cli.common import warn
from hpcvm.errors import UsageError
from hpcvm.report.formats import FORMATS

if TYPE_CHECKING:
    from hpcvm.report.model import ReportData


def _load(results: Path, run_id: int | None, option: str) -> ReportData:
    from hpcvm.report.load import load_report

    if not results.exists():
        raise UsageError(
            f"{option} {results} does not exist: give the --out directory of an `hpcvm bench` run"
        )
    return load_report(results, run_id)


@click.command("report")
@click.argument("results", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Directory for the report files (default: RESULTS/report).",
)
@click.option(
    "--format",
    "formats",
    type=click.Choice(list(FORMATS)),
    multiple=True,
    help="; ".join(f"{f.name}: {f.description}" for f in FORMATS.values())
    + ". Repeat for several (default: html).",
)
@click.option(
    "--compare",
    "other",
    type=click.Path(path_type=Path),
    default=None,
    help="A second results directory: compare it (B) with RESULTS (A) side by side.",
)
@click.option(
    "--run", "run_id", type=int, default=None, help="Run id in RESULTS (default: latest)."
)
@click.option(
    "--compare-run",
    type=int,
    default=None,
    help="Run id in the --compare directory (default: latest).",
)
def report_command(
    results: Path,
    out: Path | None,
    formats: tuple[str, ...],
    other: Path | None,
    run_id: int | None,
    compare_run: int | None,
) -> None:
    """Draw the studies' figures (overhead bars with intervals, absolute values,
    interrupts against overhead, noise detours) and write the report of RESULTS."""
    from hpcvm.report.compare import compare
    from hpcvm.report.write import check_out_dir, write_comparison, write_report

    out_dir = out if out is not None else results / "report"
    check_out_dir(out_dir)
    chosen: tuple[str, ...] = formats or ("html",)
    data = _load(results, run_id, "RESULTS")
    if other is None:
        written = write_report(data, out_dir, chosen)
        warnings = [w.text for w in data.warnings if w.kind == "tcg"]
    else:
        b = _load(other, compare_run, "--compare")
        comparison = compare(data, b)
        written = write_comparison(comparison, out_dir, chosen)
        warnings = [w.text for w in (*data.warnings, *b.warnings) if w.kind == "tcg"]
        click.echo(
            f"compared {len(comparison.rows)} figures: "
            f"{sum(r.significant for r in comparison.rows)} changed significantly"
        )
    for text in dict.fromkeys(warnings):
        warn(text)
    figures = [p for p in written if p.suffix == ".png"]
    if figures:
        click.echo(f"figures: {len(figures)} PNG files in {figures[0].parent.absolute()}")
    for path in written:
        if path.suffix != ".png":
            click.echo(f"{path.suffix.lstrip('.')}: {path.absolute()}")


def register(group: click.Group) -> None:
    """Add this module's commands to the CLI group."""
    group.add_command(report_command)
