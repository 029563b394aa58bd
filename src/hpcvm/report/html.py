"""The report as one self-contained HTML file: figures embedded as base64 PNG, no
external style, script, font or image, so it can be mailed or attached to an issue.

Every piece of text from the database (environment names, metric names, errors, log
paths, versions) is escaped. Each figure's ``<img>`` records its decoded width in a
``data-loaded`` attribute when the browser has loaded it (``error`` if it failed): a
headless browser's DOM dump then shows whether every image really displays.
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Iterable, Sequence
from html import escape
from pathlib import Path

from hpcvm.report.compare import CompareRow, Comparison
from hpcvm.report.figures import FigureFile
from hpcvm.report.fmt import (
    TABLE_HEADER,
    change_text,
    compare_significance,
    evidence_tables,
    mean_text,
    method_lines,
    np_text,
    overhead_text,
    row_cells,
    stop_text,
    tuning_text,
    when,
)
from hpcvm.report.labels import env_colours
from hpcvm.report.model import EnvInfo, ReportData, ReportWarning, Row
from hpcvm.report.scale_tables import scale_intro, scale_tables
from hpcvm.units import human_size

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1300px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: .9em; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.warn { border-left: 6px solid #e0a800; background: #fff8e1; padding: .5em .8em; margin: .4em 0; }
.warn.tcg { border-color: #c62828; background: #ffebee; font-weight: bold; font-size: 1.05em; }
.sig-yes { font-weight: bold; color: #b71c1c; }
.swatch { display: inline-block; width: .9em; height: .9em; margin-right: .3em;
          vertical-align: middle; border: 1px solid #0003; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .9em; color: #555; }
code { background: #f5f5f5; padding: 0 .2em; }
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def table(
    header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Collection[int] = ()
) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _swatch(colour: str) -> str:
    return f'<span class="swatch" style="background:{_e(colour)}"></span>'


def image_tag(png: bytes, alt: str, name: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}" data-figure="{_e(name)}" '
        'onload="this.dataset.loaded=this.naturalWidth" onerror="this.dataset.loaded=\'error\'">'
    )


# -- sections ---------------------------------------------------------------------------


def _warnings(warnings: Sequence[ReportWarning], prefix: str = "") -> str:
    if not warnings:
        return '<section id="warnings"><h2>Warnings</h2><p>None.</p></section>'
    items = "".join(
        f'<div class="warn {_e(w.kind)}" data-kind="{_e(w.kind)}">{_e(prefix + w.text)}</div>'
        for w in sorted(warnings, key=lambda w: w.kind != "tcg")
    )
    return f'<section id="warnings"><h2>Warnings</h2>{items}</section>'


def _host(data: ReportData) -> str:
    h = data.host
    if h is None:
        return '<section id="host"><h2>Host</h2><p>The run kept no host snapshot.</p></section>'
    rows = [
        ("host name", h.hostname or "-"),
        ("CPU model", h.cpu_model or "-"),
        ("packages / NUMA nodes", f"{h.packages} / {h.numa_nodes}"),
        ("cores / PUs", f"{h.cores} / {h.pus}"),
        ("memory (NUMA nodes)", human_size(h.memory_bytes)),
        ("KVM", h.kvm or "-"),
    ]
    return f'<section id="host"><h2>Host</h2>{table(("", ""), rows)}</section>'


def _env_rows(e: EnvInfo) -> list[tuple[str, str]]:
    rows = [
        ("kind / accelerator", f"{e.kind} / {e.accel}"),
        ("variant", ", ".join(f"{k}={v}" for k, v in e.variant.items()) or "-"),
        ("CPU model", e.cpu_model or "-"),
        ("vCPUs / memory", f"{e.vcpus} / {human_size(e.memory_bytes)}"),
        ("versions", ", ".join(f"{k} {v}" for k, v in sorted(e.versions.items())) or "-"),
    ]
    p = e.plan
    if p is not None:
        rows += [
            ("profile", p.profile),
            ("topology", p.topology),
            ("vCPU pinning", p.pinning),
            ("guest NUMA nodes", "; ".join(p.guest_nodes)),
            ("memory backing", p.memory_backing),
            ("guest CPU / clock", f"{p.cpu_model} / {p.clock}"),
            ("QEMU threads on PUs", p.emulator_pus or "not restricted"),
        ]
    return rows


def _envs(data: ReportData) -> str:
    colours = env_colours(data.env_names)
    parts = ['<section id="environments"><h2>Environments</h2>']
    for e in data.envs:
        parts.append(
            f'<h3 data-env="{_e(e.name)}">{_swatch(colours[e.name])}{_e(e.name)}</h3>'
            + table(("", ""), _env_rows(e))
        )
    parts.append("</section>")
    return "".join(parts)


def _method(data: ReportData) -> str:
    items = "".join(f"<li>{_e(line)}</li>" for line in method_lines(data))
    args = _e(", ".join(f"{k}={v}" for k, v in sorted(data.run.args.items())))
    return (
        f'<section id="method"><h2>Method</h2><ul>{items}</ul>'
        f"<details><summary>Arguments of the run</summary><code>{args}</code></details>"
        "</section>"
    )


def _figures(figures: Sequence[FigureFile], out_dir: Path) -> str:
    parts = ['<section id="figures"><h2>Figures</h2>']
    if not figures:
        parts.append("<p>No figures: the run has no rows to draw.</p>")
    for f in figures:
        png = (out_dir / f.path).read_bytes()
        parts.append(
            f'<figure id="fig-{_e(Path(f.path).stem)}"><h3>{_e(f.title)}</h3>'
            f"{image_tag(png, f.title, f.path)}<figcaption>{_e(f.caption)}"
            + (f'<br><strong class="differs">{_e(f.differs)}</strong>' if f.differs else "")
            + "</figcaption></figure>"
        )
    parts.append("</section>")
    return "".join(parts)


def _results(data: ReportData) -> str:
    parts = ['<section id="results"><h2>Results</h2>']
    numeric = {4}
    for suite in dict.fromkeys(r.suite for r in data.rows):
        main = [r for r in data.rows if r.suite == suite and not r.is_detail]
        detail = [r for r in data.rows if r.suite == suite and r.is_detail]
        parts.append(f'<h3 data-suite="{_e(suite)}">{_e(suite)}</h3>')
        parts.append(_rows_table(main, numeric))
        if detail:
            parts.append(
                f"<details><summary>{len(detail)} per-CPU detail rows</summary>"
                f"{_rows_table(detail, numeric)}</details>"
            )
    parts.append("</section>")
    return "".join(parts)


def _rows_table(rows: Sequence[Row], numeric: Collection[int]) -> str:
    body = []
    for r in rows:
        cells = row_cells(r)
        sig = "sig-yes" if r.significant else ""
        tds = "".join(
            f'<td class="{"num" if i in numeric else ""} {sig if i == 8 else ""}">{_e(c)}</td>'
            for i, c in enumerate(cells)
        )
        body.append(f'<tr data-env="{_e(r.env)}" data-metric="{_e(r.metric)}">{tds}</tr>')
    head = "".join(f"<th>{_e(h)}</th>" for h in TABLE_HEADER)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _evidence(data: ReportData) -> str:
    parts = ['<section id="evidence"><h2>Evidence</h2>']
    for t in evidence_tables(data, "\n"):
        parts.append(f"<h3>{_e(t.title)}</h3>")
        if t.intro:
            parts.append(f"<p>{_e(t.intro)}</p>")
        parts.append(table(t.header, t.rows, t.numeric))
    if data.noise:
        noise_rows = [(c.env, str(c.samples), f"{c.quanta:,}") for c in data.noise]
        parts.append("<h3>Noise runs drawn</h3>")
        parts.append(table(("env", "runs", "quanta"), noise_rows, {1, 2}))
    for note in data.notes:
        parts.append(f'<p class="note">{_e(note)}</p>')
    parts.append("</section>")
    return "".join(parts)


def _scale(data: ReportData) -> str:
    """The "At scale" section: report/scale_tables.py's text and tables, laid out."""
    if data.scale is None:
        return ""
    tables = "".join(
        f"<h3>{_e(t.title)}</h3>" + table(t.header, t.rows, t.numeric)
        for t in scale_tables(data.scale)
    )
    intro = _e(scale_intro(data.scale))
    return f'<section id="scale"><h2>At scale</h2><p>{intro}</p>{tables}</section>'


def page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head>"
        f'<body data-report="hpcvm"><h1>{_e(title)}</h1>{body}</body></html>\n'
    )


def render_html(data: ReportData, figures: Sequence[FigureFile], out_dir: Path) -> str:
    """The whole page; ``figures`` are read from ``out_dir`` and embedded."""
    envs = ", ".join(data.env_names)
    body = "".join(
        [
            f"<p>Environments: {_e(envs)}. Status: {_e(data.run.status)}.</p>",
            _warnings(data.warnings),
            _host(data),
            _envs(data),
            _method(data),
            _figures(figures, out_dir),
            _scale(data),
            _results(data),
            _evidence(data),
        ]
    )
    return page(f"hpcvm report: run {data.run.id} of {data.run.results_dir}", body)


# -- comparison -------------------------------------------------------------------------

COMPARE_HEADER = (
    "benchmark",
    "metric",
    "np",
    "env",
    "A mean [interval]",
    "B mean [interval]",
    "unit",
    "change B vs A % [interval]",
    "significant",
    "A overhead %",
    "B overhead %",
)


def _runs_table(c: Comparison) -> str:
    def envs(d: ReportData) -> str:
        return ", ".join(f"{e.name} ({e.accel})" for e in d.envs)

    def reps(d: ReportData) -> str:
        return ", ".join(f"{k}: {v}" for k, v in d.run.repetitions.items())

    rows = [
        ("results", c.a.run.results_dir, c.b.run.results_dir),
        ("run", str(c.a.run.id), str(c.b.run.id)),
        ("status", c.a.run.status, c.b.run.status),
        ("started", when(c.a.run.started_at), when(c.b.run.started_at)),
        ("environments (accelerator)", envs(c.a), envs(c.b)),
        ("repetitions", reps(c.a), reps(c.b)),
        ("stopped by", stop_text(c.a.run.stop_reason), stop_text(c.b.run.stop_reason)),
        ("confidence", f"{c.a.run.confidence:g}", f"{c.b.run.confidence:g}"),
        ("host tuning", tuning_text(c.a.run.args), tuning_text(c.b.run.args)),
        (
            "host CPU",
            c.a.host.cpu_model if c.a.host else "-",
            c.b.host.cpu_model if c.b.host else "-",
        ),
    ]
    return f'<section id="runs"><h2>Runs</h2>{table(("", "A", "B"), rows)}</section>'


def compare_cells(r: CompareRow) -> tuple[str, ...]:
    return (
        r.label,
        r.metric,
        np_text(r.np),
        r.env,
        mean_text(r.a),
        mean_text(r.b),
        r.unit or "-",
        change_text(r),
        compare_significance(r),
        overhead_text(r.a),
        overhead_text(r.b),
    )


def _compare_table(c: Comparison) -> str:
    body = []
    for r in c.rows:
        sig = ' class="sig-yes"' if r.significant else ""
        tds = "".join(f"<td>{_e(x)}</td>" for x in compare_cells(r))
        body.append(
            f'<tr{sig} data-env="{_e(r.env)}" data-metric="{_e(r.metric)}" '
            f'data-significant="{str(r.significant).lower()}">{tds}</tr>'
        )
    head = "".join(f"<th>{_e(h)}</th>" for h in COMPARE_HEADER)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_compare_html(c: Comparison, figures: Sequence[FigureFile], out_dir: Path) -> str:
    """The comparison page: both runs, the method, figures, the side-by-side table."""
    warnings = [w.model_copy(update={"text": "A: " + w.text}) for w in c.a.warnings] + [
        w.model_copy(update={"text": "B: " + w.text}) for w in c.b.warnings
    ]
    n_sig = sum(r.significant for r in c.rows)
    unmatched = "".join(
        f"<p>Only in {side}: {_e('; '.join(items))}</p>"
        for side, items in (("A", c.only_a), ("B", c.only_b))
        if items
    )
    body = "".join(
        [
            _warnings(warnings),
            _runs_table(c),
            f'<section id="method"><h2>Method</h2><p>{_e(c.method)}</p></section>',
            _figures(figures, out_dir),
            f'<section id="comparison"><h2>Comparison</h2><p>{n_sig} of {len(c.rows)} '
            "compared figures changed significantly (marked in bold).</p>"
            f"{_compare_table(c)}{unmatched}</section>",
        ]
    )
    title = (
        f"hpcvm comparison: A = run {c.a.run.id} of {c.a.run.results_dir}, "
        f"B = run {c.b.run.id} of {c.b.run.results_dir}"
    )
    return page(title, body)
