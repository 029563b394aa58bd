"""Text from a results database is data, never markup: names and errors with HTML,
Markdown and mathtext characters come out escaped in every output.

The database holds real timings of ``/bin/true`` (taken here with perf_counter, twice
per environment and repetition) under environment, metric and unit names a user could
type, plus a real failed run whose error message quotes them.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from hpcvm.report.formats import FORMATS
from hpcvm.report.load import load_report
from hpcvm.report.markdown import md_table
from hpcvm.report.write import write_report
from hpcvm.store import MetricRecord, NewEnvironment, NewSample, Store

ODD_ENV = 'vm:<img src=x onerror="alert(1)">&amp;'
ODD_METRIC = "<b>t|ime</b> $x$"
ODD_UNIT = "s<script>"
ODD_ERROR = "</td><script>alert(2)</script> | pipe"


def _time_true() -> float:
    start = time.perf_counter()
    subprocess.run(["/bin/true"], check=True)
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("odd")
    with Store.open(out, create=True) as store:
        run_id = store.create_run(args={}, seed=1, confidence=0.97)
        for env in ("native", ODD_ENV):
            store.add_environment(
                run_id,
                NewEnvironment(name=env, kind="native", accel="native", vcpus=1, memory_bytes=1),
            )
        for rep in range(1, 4):
            for env in ("native", ODD_ENV):
                metric = MetricRecord(
                    metric=ODD_METRIC, unit=ODD_UNIT, higher_is_better=False, value=_time_true()
                )
                sample = NewSample(
                    env=env,
                    suite="cmd",
                    np=None,
                    repetition=rep,
                    warmup=False,
                    position=0,
                    ok=True,
                    started_at=time.time(),
                    metrics=(metric,),
                )
                store.add_sample(run_id, sample)
        failed = NewSample(
            env=ODD_ENV,
            suite="cmd",
            np=None,
            repetition=4,
            warmup=False,
            position=0,
            ok=False,
            error=ODD_ERROR,
            log_path=str(out / "<log>.txt"),
            started_at=time.time(),
        )
        store.add_sample(run_id, failed)
        store.set_status(run_id, "finished", stop_reason="fixed")
    write_report(load_report(out), out / "report", FORMATS)
    return out / "report"


def test_html_escapes_every_database_string(report: Path) -> None:
    html = (report / "report.html").read_text()
    for raw in (ODD_ENV, ODD_METRIC, ODD_UNIT, ODD_ERROR, "<log>.txt"):
        assert raw not in html, raw
    assert "<script" not in html
    assert 'onerror="alert' not in html
    assert "vm:&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp;" in html
    assert "&lt;/td&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in html


def test_markdown_cells_keep_pipes_inside_their_cell(report: Path) -> None:
    md = (report / "report.md").read_text()
    [line] = md_table(("a",), [(ODD_ERROR,)])[2:3]
    assert line == "| </td><script>alert(2)</script> \\| pipe |"
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "t\\|ime" in ln]
    assert len(rows) == 2  # native and the odd environment
    header = next(ln for ln in md.splitlines() if ln.startswith("| benchmark"))
    unescaped = [r.replace("\\|", "") for r in rows]
    assert all(r.count("|") == header.count("|") for r in unescaped)


def test_figures_draw_names_literally(report: Path) -> None:
    # A "$" would have started matplotlib's mathtext; the figure must still render.
    pngs = sorted((report / "figures").glob("*.png"))
    assert [p.name for p in pngs] == ["absolute-cmd.png", "overhead-cmd.png"]
