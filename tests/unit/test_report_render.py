"""The report's HTML, Markdown, JSON and figures from a real measured database.

The database is measured when the tests run (tests/report_support.py: native, the same
under ``nice -n 19``, and under qemu-x86_64's TCG emulation; the noise and cmd suites;
one really failing sample), so every number is real and nothing here knows it in
advance: the checks compare the outputs with the database and with each other.
"""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib import colors
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.patches import Rectangle

from hpcvm.bench.results.results import summarize_run
from hpcvm.bench.suites.noise.suite import RAW_FILE, read_raw
from hpcvm.report.drawing import TCG_NOTE
from hpcvm.report.figures import (
    absolute_figure,
    interrupts_figure,
    noise_figure,
    overhead_figure,
)
from hpcvm.report.fmt import row_cells
from hpcvm.report.formats import FORMATS
from hpcvm.report.labels import env_colours, env_order, label, short_name
from hpcvm.report.load import build_report, load_report
from hpcvm.report.markdown import cell
from hpcvm.report.model import NATIVE, ReportData
from hpcvm.report.write import write_report
from hpcvm.store import Store
from tests.report_support import ENVS, QUANTA, REPS, measured

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TCG_ENV = "tcg-user"


class Page(HTMLParser):
    """Every start tag with its attributes, and the page's text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return measured(tmp_path_factory, "main")


@pytest.fixture(scope="module")
def data(db: Path) -> ReportData:
    return load_report(db)


@pytest.fixture(scope="module")
def out(data: ReportData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    write_report(data, out, FORMATS)
    return out


@pytest.fixture(scope="module")
def page(out: Path) -> Page:
    return Page((out / "report.html").read_text())


def test_rows_are_hpcvm_results_rows_with_their_values(db: Path, data: ReportData) -> None:
    with Store.open(db) as store:
        run = store.run()
        results = summarize_run(run, store.environments(run.id), store.samples(run.id))
    assert len(data.rows) == len(results) > 0
    for mine, theirs in zip(data.rows, results, strict=True):
        assert (mine.env, mine.suite, mine.np, mine.metric) == (
            theirs.env,
            theirs.suite,
            theirs.np,
            theirs.metric,
        )
        assert (mine.n, mine.mean, mine.ci_low, mine.ci_high) == (
            theirs.n,
            theirs.mean,
            theirs.ci_low,
            theirs.ci_high,
        )
        assert len(mine.values) == mine.n
        assert mine.mean == pytest.approx(float(np.mean(mine.values)))
        if theirs.overhead_ci_low is not None:
            assert mine.overhead_pct == theirs.overhead_pct
            assert mine.significant == theirs.significant
    assert {r.env for r in data.rows} == set(ENVS)


def test_html_holds_every_environment_and_every_row(data: ReportData, page: Page) -> None:
    headed = {a["data-env"] for a in page.all("h3") if "data-env" in a}
    assert headed == set(ENVS)
    shown = [(a["data-env"], a["data-metric"]) for a in page.all("tr") if "data-metric" in a]
    assert sorted(shown) == sorted((r.env, r.metric) for r in data.rows)
    text = " ".join(page.text)
    for r in data.rows:
        assert label(r.suite, r.metric, r.np) in text


def test_html_is_one_self_contained_file(out: Path, page: Page) -> None:
    figures = sorted((out / "figures").glob("*.png"))
    images = page.all("img")
    assert len(images) == len(figures) >= 4
    for img in images:
        src = img["src"] or ""
        assert src.startswith("data:image/png;base64,")
        name = img["data-figure"] or ""
        assert base64.b64decode(src.split(",", 1)[1]) == (out / name).read_bytes()
    assert not page.all("link") and not page.all("script")
    for attrs in (a for _, a in page.tags):
        for key in ("src", "href"):
            value = attrs.get(key)
            assert value is None or value.startswith("data:"), (key, value)


def test_figure_files_are_valid_pngs_of_every_kind(out: Path) -> None:
    report = json.loads((out / "report.json").read_text())
    kinds = {f["kind"] for f in report["figures"]}
    assert kinds == {"overhead", "overview", "absolute", "interrupts", "noise"}
    for f in report["figures"]:
        path = out / f["path"]
        assert path.read_bytes()[:8] == PNG_MAGIC
        pixels = imread(path)
        assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 200
        assert float(pixels[..., :3].std()) > 0.05  # not a blank canvas


def _legend(fig: Figure) -> dict[str, str]:
    """Legend label -> colour (face colour of patches, line colour of lines)."""
    found: dict[str, str] = {}
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    for legend in legends:
        assert legend is not None
        for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
            assert handle is not None
            getter = getattr(handle, "get_color", None) or handle.get_facecolor  # type: ignore[attr-defined]
            found[text.get_text()] = colors.to_hex(getter())
    return found


def _xticks(fig: Figure) -> set[str]:
    return {t.get_text() for ax in fig.axes for t in ax.get_xticklabels() if t.get_text()}


def test_figures_show_every_environment_and_metric(data: ReportData) -> None:
    colours = env_colours(data.env_names)
    for suite in dict.fromkeys(r.suite for r in data.rows):
        rows = [r for r in data.rows if r.suite == suite and not r.detail and r.mean is not None]
        vm_rows = [r for r in rows if r.env != NATIVE and r.overhead_pct is not None]
        fig = overhead_figure(rows, colours, suite, 0.97)
        assert fig is not None
        assert set(_legend(fig)) >= {r.env for r in vm_rows}
        assert _xticks(fig) == {label(suite, r.metric, r.np) for r in vm_rows}
        fig = absolute_figure(rows, colours, suite, 0.97)
        assert fig is not None
        assert set(_legend(fig)) == {r.env for r in rows}
        titles = " ".join(ax.get_title() for ax in fig.axes)
        for r in rows:
            assert short_name(suite, r.metric) in titles
        for ax in fig.axes:
            assert ax.get_ylabel()  # the unit


def test_colours_are_one_mapping_in_every_figure(data: ReportData) -> None:
    colours = env_colours(data.env_names)
    assert len(set(colours.values())) == len(colours)
    assert env_colours(reversed(data.env_names)) == colours
    assert env_colours([*data.env_names, "vm:hpc"])[TCG_ENV] == colours[TCG_ENV]
    rows = [r for r in data.rows if r.suite == "cmd"]
    figures = [
        overhead_figure(rows, colours, "cmd", 0.97),
        absolute_figure(rows, colours, "cmd", 0.97),
        interrupts_figure(data, colours),
        noise_figure(data.noise, colours, tcg=True),
    ]
    seen = 0
    for fig in figures:
        assert fig is not None
        for text, colour in _legend(fig).items():
            env = next((e for e in ENVS if text == e or text.startswith(e + " (")), None)
            if env is not None:
                assert colour == colours[env], (text, colour)
                seen += 1
    assert seen >= 2 + 3 + 3 + 3
    drawn = 0
    for fig in figures:
        assert fig is not None
        for ax in fig.axes:
            for artist in [*ax.patches, *ax.collections]:
                env = artist.get_gid()
                if env is None:
                    continue
                if isinstance(artist, Rectangle):
                    hatched = bool(artist.get_hatch())
                    drawn_as = colors.to_hex(
                        artist.get_edgecolor() if hatched else artist.get_facecolor()
                    )
                else:
                    assert isinstance(artist, PathCollection)
                    r, g, b, a = np.asarray(artist.get_facecolor(), dtype=float)[0]
                    drawn_as = colors.to_hex((float(r), float(g), float(b), float(a)))
                assert drawn_as == colours[env], (env, drawn_as)
                drawn += 1
    assert drawn >= 2 * 2 + 3 * 2 + 3 * 2  # overhead bars, absolute bars, points of cmd
    noise = noise_figure(data.noise, colours, tcg=True)
    assert noise is not None
    lines = {
        str(ln.get_label()).split(" (")[0]: colors.to_hex(ln.get_color())
        for ln in noise.axes[0].lines
    }
    assert lines == {c.env: colours[c.env] for c in data.noise}


def test_tcg_is_warned_prominently_everywhere(data: ReportData, out: Path, page: Page) -> None:
    tcg = [w for w in data.warnings if w.kind == "tcg"]
    assert [w.env for w in tcg] == [TCG_ENV]
    boxes = [a for a in page.all("div") if "warn" in (a.get("class") or "")]
    assert boxes[0]["data-kind"] == "tcg" and "tcg" in (boxes[0]["class"] or "").split()
    html = (out / "report.html").read_text()
    assert f"{TCG_ENV} ran under TCG (software emulation)" in html
    md = (out / "report.md").read_text()
    assert re.search(rf"^- \*\*TCG\*\*: {TCG_ENV} ran under TCG", md, re.MULTILINE)
    fig = overhead_figure(list(data.rows), env_colours(data.env_names), "cmd", 0.97)
    assert fig is not None and TCG_NOTE in fig.get_suptitle()


def test_no_tcg_warning_without_a_tcg_environment(db: Path) -> None:
    with Store.open(db) as store:
        run = store.run()
        envs = [e for e in store.environments(run.id) if e.accel != "tcg"]
        samples = [s for s in store.samples(run.id) if s.env != TCG_ENV]
    data = build_report(run, envs, samples, db)
    assert not [w for w in data.warnings if w.kind == "tcg"]
    assert TCG_ENV not in data.env_names
    fig = overhead_figure(list(data.rows), env_colours(data.env_names), "cmd", 0.97)
    assert fig is not None and TCG_NOTE not in fig.get_suptitle()


def test_failed_sample_is_warned_with_its_count_and_log(data: ReportData, out: Path) -> None:
    failed = [w for w in data.warnings if w.kind == "failed"]
    assert len(failed) == 1 and failed[0].text.startswith("1 of 1 samples of native")
    assert "no valid sample" in failed[0].text
    [failure] = data.failures
    assert failure.count == 1 and "exited with code 1" in failure.errors[0]
    assert failure.reason == failure.errors[0] and (failure.samples, failure.valid) == (1, 0)
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    assert "most frequent reason" in html and "most frequent reason" in md
    [log] = failure.log_paths
    assert Path(log).is_file()
    assert log in (out / "report.html").read_text()
    assert log in (out / "report.md").read_text()


def test_markdown_tables_list_every_row(data: ReportData, out: Path) -> None:
    md = (out / "report.md").read_text()
    table_lines = set(md.splitlines())
    for r in data.rows:
        line = "| " + " | ".join(cell(c) for c in row_cells(r)) + " |"
        assert line in table_lines, line
    results = md.split("## Results: ")[1:]
    counted = sum(
        1
        for section in results
        for line in section.split("\n## ")[0].splitlines()
        if line.startswith("| ") and not line.startswith("| benchmark")
    )
    assert counted == len(data.rows)
    for fig in (out / "figures").glob("*.png"):
        assert f"(figures/{fig.name})" in md


def test_json_round_trips_the_report(data: ReportData, out: Path) -> None:
    report = json.loads((out / "report.json").read_text())
    assert ReportData.model_validate(report["report"]) == data
    assert report["schema"] == "hpcvm-report/1"


def test_detour_curve_is_the_raw_durations_survival_function(db: Path, data: ReportData) -> None:
    for curve in data.noise:
        raws = [
            read_raw(p / RAW_FILE)
            for p in sorted((db / "work").glob(f"{curve.env}-noise-None-[1-9]"))
        ]
        assert len(raws) == REPS == curve.samples
        detours = (
            np.concatenate(
                [np.asarray(d, dtype=np.int64) - min(d) for raw in raws for d in raw.values()]
            )
            / 1e3
        )
        assert curve.quanta == detours.size == QUANTA * len(raws[0]) * REPS
        assert len(curve.detour_us) > 20
        for x, fraction in zip(curve.detour_us, curve.fraction_above, strict=True):
            assert fraction == pytest.approx(float(np.mean(detours > x)))
        assert curve.detour_us[-1] <= detours.max()


def test_interrupt_rates_are_the_samples_evidence(db: Path, data: ReportData) -> None:
    with Store.open(db) as store:
        samples = [s for s in store.samples(store.run().id) if s.ok and not s.warmup]
    assert data.interrupts
    for rate in data.interrupts:
        mine = [s for s in samples if (s.env, s.suite, s.np) == (rate.env, rate.suite, rate.np)]
        totals = [sum(s.evidence["interrupts"][rate.side].values()) for s in mine]
        assert rate.samples == len(mine) == REPS
        assert rate.total_per_s == pytest.approx(float(np.mean(totals)))


def test_environments_are_ordered_native_first(data: ReportData) -> None:
    assert env_order(data.env_names)[0] == NATIVE
    assert data.run.repetitions == dict.fromkeys(ENVS, REPS)
