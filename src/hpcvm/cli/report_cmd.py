"""`hpcvm report`: the figures, HTML, Markdown and JSON of a results directory, or two
result sets compared side by side."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcvm.bench.results.outdir import path_option
from hpcvm.cli.common import warn
from hpcvm.errors import UsageError
from hpcvm.report.formats import FORMATS

if TYPE_CHECKING:
    from hpcvm.report.model import ReportData, ScaleReport
    from hpcvm.report.scale import ScaleRequest


def _exists(results: Path, option: str) -> None:
    """Refuse a RESULTS (or --compare) path that does not exist, before any work (one
    this user may not enter is said by the store, as for ``hpcvm results``)."""
    try:
        os.stat(results)
    except FileNotFoundError:
        raise UsageError(
            f"{option} {results} does not exist: give the --out directory of an `hpcvm bench` run"
        ) from None
    except OSError:
        pass  # Store.open names what is wrong with it


def _load(results: Path, run_id: int | None, scale: ScaleRequest | None = None) -> ReportData:
    from hpcvm.report.load import load_report

    return load_report(results, run_id, scale)


def _scale_request(
    cores: str | None,
    grains: str | None,
    latency: str | None,
    noise: Path | None,
    other: Path | None,
) -> ScaleRequest | None:
    """The prediction ``--scale`` asks for, or None; its companions without it, or with
    ``--compare``, are a usage error rather than silently ignored."""
    from hpcvm.report.scale import ScaleRequest, parse_cores, parse_grains, parse_time_ns

    if cores is None:
        if grains is not None or latency is not None or noise is not None:
            raise UsageError("--grain, --scale-latency and --scale-noise go with --scale CORES")
        return None
    if other is not None:
        raise UsageError("--scale predicts one run: leave out --compare")
    request = ScaleRequest(cores=parse_cores(cores))
    if grains is not None:
        request = replace(request, grains_ns=parse_grains(grains))
    if latency is not None:
        request = replace(request, latency_ns=parse_time_ns(latency, "--scale-latency"))
    if noise is not None:
        _exists(noise, "--scale-noise")
        request = replace(request, noise_from=noise)
    return request


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


@click.command("report")
@click.argument("results", type=str, callback=path_option)
@click.option(
    "--out",
    type=str,
    callback=path_option,
    default=None,
    metavar="DIRECTORY",
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
    type=str,
    callback=path_option,
    default=None,
    metavar="DIRECTORY",
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
@click.option(
    "--scale",
    "scale_cores",
    default=None,
    metavar="CORES",
    help="Predict what each environment's measured noise costs a bulk-synchronous code "
    "at these core counts (e.g. 1024,4096,16384) from the noise suite's raw quanta: a "
    "table, and a figure from 1 to 16,384 cores (docs/scale.md).",
)
@click.option(
    "--grain",
    "grains",
    default=None,
    metavar="TIMES",
    help="With --scale: the work between collectives (default: 10us,100us,1ms,10ms).",
)
@click.option(
    "--scale-latency",
    default=None,
    metavar="TIME",
    help="With --scale: one stage of the collective (e.g. 1.5us; default: the run's "
    "netpipe 1-byte latency per environment, else 1.5us).",
)
@click.option(
    "--scale-noise",
    type=str,
    callback=path_option,
    default=None,
    metavar="DIRECTORY",
    help="With --scale: take the noise traces from the latest run in this results "
    "directory (e.g. a one-node noise run beside a bench --nodes bsp run).",
)
def report_command(
    results: Path,
    out: Path | None,
    formats: tuple[str, ...],
    other: Path | None,
    run_id: int | None,
    compare_run: int | None,
    scale_cores: str | None,
    grains: str | None,
    scale_latency: str | None,
    scale_noise: Path | None,
) -> None:
    """Draw the studies' figures (overhead bars with intervals, absolute values,
    interrupts against overhead, noise detours) and write the report of RESULTS.

    With --scale, also predict what each environment's measured noise costs a
    bulk-synchronous code at those core counts (docs/scale.md)."""
    from hpcvm.report.compare import compare
    from hpcvm.report.write import check_out_dir, write_comparison, write_report

    scale = _scale_request(scale_cores, grains, scale_latency, scale_noise, other)
    _exists(results, "RESULTS")
    if other is not None:
        _exists(other, "--compare")
    out_dir = out if out is not None else results / "report"
    check_out_dir(out_dir)
    chosen: tuple[str, ...] = formats or ("html",)
    data = _load(results, run_id, scale)
    if other is None:
        written = write_report(data, out_dir, chosen)
        warnings = [w.text for w in data.warnings if w.kind == "tcg"]
    else:
        b = _load(other, compare_run)
        comparison = compare(data, b)
        written = write_comparison(comparison, out_dir, chosen)
        warnings = [w.text for w in (*data.warnings, *b.warnings) if w.kind == "tcg"]
        click.echo(
            f"compared {_plural(len(comparison.rows), 'figure')}: "
            f"{sum(r.significant for r in comparison.rows)} changed significantly"
        )
    for text in dict.fromkeys(warnings):
        warn(text)
    if data.scale is not None:
        _echo_scale(data)
    figures = [p for p in written if p.suffix == ".png"]
    if figures:
        click.echo(
            f"figures: {_plural(len(figures), 'PNG file')} in {figures[0].parent.absolute()}"
        )
    for path in written:
        if path.suffix != ".png":
            click.echo(f"{path.suffix.lstrip('.')}: {path.absolute()}")


def _echo_scale(data: ReportData) -> None:
    """The headline: each VM's predicted overhead at the largest core count asked, per
    grain, beside the prediction at the scale the run had and what bsp measured there;
    then what could not be predicted."""
    scale = data.scale
    assert scale is not None
    top = max(scale.asked)
    ran = {(o.env, o.grain_ns): o for o in scale.overheads if o.cores == scale.ran}
    for o in scale.overheads:
        if o.cores != top:
            continue
        here = ran[(o.env, o.grain_ns)]
        line = (
            f"at {top:,} cores, grain {o.grain_ns / 1e3:g} us: {o.env} "
            f"{o.overhead_pct:+.1f}% [{o.low_pct:+.1f}, {o.high_pct:+.1f}] against native "
            f"(at the {scale.ran} cores run: {here.overhead_pct:+.1f}%"
        )
        for m in scale.measured:
            if m.env == o.env and m.overhead_pct is not None and scale.grain_of(m) == o.grain_ns:
                line += f"; bsp measured {m.overhead_pct:+.1f}% at np {m.cores}"
        click.echo(line + ")")
    _echo_check(scale)
    for note in scale.notes:
        warn(note)


def _echo_check(scale: ScaleReport) -> None:
    """Each bsp measurement beside the prediction from the same noise, with the verdict
    (the rows of the report's check table, so the two never disagree)."""
    from hpcvm.report.scale_tables import check_rows

    for env, np, grain, measured, predicted, agrees in check_rows(scale):
        verdict = {"yes": "agree", "no": "DISAGREE", "-": "no prediction"}[agrees]
        click.echo(
            f"bsp check: {env} np {np}, grain {grain} us: measured {measured}%, "
            f"predicted {predicted}%: {verdict}"
        )


def register(group: click.Group) -> None:
    """Add this module's commands to the CLI group."""
    group.add_command(report_command)
