"""``--compare``: two real measured result sets side by side.

Run A is the shared measured database (tests/report_support.py). Run B is measured
natively with the noise benchmark's quantum doubled (100 us instead of 50 us): its
NoiseQuantum_usec (the fastest quantum, which filters out this noisy machine's stalls)
really doubles, a change the comparison must find significant; its other figures may or
may not change. The expected change is computed here from the stored samples with numpy,
not by the code under test.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from hpcvm.errors import BenchmarkError
from hpcvm.report.compare import Comparison, compare, compare_rows
from hpcvm.report.formats import FORMATS
from hpcvm.report.load import load_report
from hpcvm.report.model import ReportData
from hpcvm.report.write import write_comparison
from hpcvm.store import Store
from tests.report_support import ENVS, measured

# Significance rests on timing the noise program's real work, 3 samples a side: an xdist
# worker beside it on the same cores widened the interval past significance (2 of 3
# parallel runs at load 5-8), so it runs in the serial part (scripts/test.sh).
pytestmark = pytest.mark.alone

QUANTUM = "NoiseQuantum_usec"


@pytest.fixture(scope="module")
def a(tmp_path_factory: pytest.TempPathFactory) -> ReportData:
    return load_report(measured(tmp_path_factory, "main"))


@pytest.fixture(scope="module")
def b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return measured(
        tmp_path_factory,
        "quantum100",
        envs=("native",),
        cells=(("noise", None),),
        quantum_us=100,
        failing=False,
    )


@pytest.fixture(scope="module")
def c(a: ReportData, b_dir: Path) -> Comparison:
    return compare(a, load_report(b_dir))


def _stored(db: Path, metric: str) -> list[float]:
    with Store.open(db) as store:
        samples = store.samples(store.run().id, include_warmup=False)
    return [
        m.value
        for s in samples
        if s.env == "native" and s.ok
        for m in s.metrics
        if m.metric == metric and m.value is not None
    ]


def test_a_run_against_itself_changes_nothing(a: ReportData) -> None:
    same = compare(a, a)
    assert len(same.rows) == len(a.rows)
    assert not same.only_a and not same.only_b
    for r in same.rows:
        assert r.change_pct == pytest.approx(0.0, abs=1e-9)
        assert not r.significant


def test_a_doubled_quantum_is_a_significant_change(
    c: Comparison, a: ReportData, b_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    [row] = [r for r in c.rows if r.metric == QUANTUM]
    a_dir = Path(a.run.results_dir)
    expected = (np.mean(_stored(b_dir, QUANTUM)) / np.mean(_stored(a_dir, QUANTUM)) - 1) * 100
    assert row.change_pct is not None
    assert row.change_pct == pytest.approx(float(expected))
    assert 50.0 < row.change_pct < 200.0  # about +100%: twice the work per quantum
    assert row.significant
    assert row.change_ci_low is not None and row.change_ci_low > 0.0
    assert row.change_ci_high is not None and row.change_ci_high > row.change_pct


def test_only_matching_rows_are_compared(c: Comparison, a: ReportData) -> None:
    assert {r.env for r in c.rows} == {"native"}
    assert {r.suite for r in c.rows} == {"noise"}
    unmatched = [r for r in a.rows if r.env != "native" or r.suite != "noise"]
    assert len(c.only_a) == len(unmatched) > 0
    assert not c.only_b
    assert any(ENVS[2] in text for text in c.only_a)


def test_outputs_mark_exactly_the_significant_rows(c: Comparison, tmp_path: Path) -> None:
    written = write_comparison(c, tmp_path, FORMATS)
    assert {p.name for p in written} >= {"compare.html", "compare.md", "compare.json"}
    for png in (p for p in written if p.suffix == ".png"):
        assert imread(png).shape[0] > 100
    html = (tmp_path / "compare.html").read_text()
    marked = re.findall(r'<tr class="sig-yes" data-env="[^"]*" data-metric="([^"]*)"', html)
    assert sorted(marked) == sorted(r.metric for r in c.rows if r.significant)
    assert QUANTUM in marked
    assert "Fieller" in html and "Welch" in html
    md = (tmp_path / "compare.md").read_text()
    bold = [line for line in md.splitlines() if line.startswith("| **")]
    assert len(bold) == sum(r.significant for r in c.rows)
    assert any("yes: B worse" in line for line in bold)


def test_rows_of_different_units_are_refused(a: ReportData) -> None:
    row = a.rows[0]
    with pytest.raises(BenchmarkError, match="cannot compare"):
        compare_rows(row, row.model_copy(update={"unit": "furlongs"}), 0.97)


def _tuned(data: ReportData, tuning: dict[str, str]) -> ReportData:
    run = data.run.model_copy(update={"args": {**data.run.args, "tuning": tuning}})
    return data.model_copy(update={"run": run})


def test_each_side_shows_its_host_tuning(a: ReportData, b_dir: Path, tmp_path: Path) -> None:
    """An untuned run compared with a tuned one: the comparison must say which side was
    tuned, else its change cannot be read as the tuning's. The measured runs here record
    no tuning (they are not started by ``bench``), so each side is given the record
    ``bench`` writes: A untuned, B applied by hpcvm."""
    applied = "applied by hpcvm 2026-11-23T00:00:00+00:00 for --vcpu-pus"
    a_side = _tuned(a, {"hpcvm_tune": "not applied", "timer_migration": "1"})
    b_side = _tuned(load_report(b_dir), {"hpcvm_tune": applied, "timer_migration": "0"})
    write_comparison(compare(a_side, b_side), tmp_path, FORMATS)
    md = (tmp_path / "compare.md").read_text()
    assert "- **A**: hpcvm tune not applied; timer_migration 1" in md
    assert f"- **B**: hpcvm tune {applied}; timer_migration 0" in md
    html = (tmp_path / "compare.html").read_text()
    row = re.search(r"<tr><td>host tuning</td><td>(.*?)</td><td>(.*?)</td></tr>", html)
    assert row, "no host tuning row in the runs table"
    assert "not applied" in row[1] and applied in row[2] and applied not in row[1]


def test_a_run_without_a_tuning_record_says_so(c: Comparison, tmp_path: Path) -> None:
    write_comparison(c, tmp_path, FORMATS)
    assert "- **A**: not recorded" in (tmp_path / "compare.md").read_text()
