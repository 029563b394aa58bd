"""The latency/bandwidth-against-message-size figure: which rows it takes (by the
registry's message sizes, never by names), its axes, one line per environment in the
report's colours, and the interval band drawn from each interval's own bounds.

Layout test: rows are built here from the netpipe suite's real metric definitions with
seeded random values (nothing measured, no number asserted beyond what was put in).
The render test writes a whole report from those rows and checks the figure is listed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from matplotlib import colors
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.image import imread

from hpcvm.bench.suites.hpcc.suite import METRICS as HPCC_METRICS
from hpcvm.bench.suites.netpipe.suite import METRICS, SIZES
from hpcvm.report.drawing import DPI
from hpcvm.report.figures import render_figures
from hpcvm.report.labels import env_colours
from hpcvm.report.model import NATIVE, EnvInfo, ReportData, Row, RunInfo
from hpcvm.report.sizes import bytes_label, sized_rows, sizes_figure
from hpcvm.report.write import write_report

ENVS = (NATIVE, "vm:naive", "vm:hpc")


def _rows(suite: str = "netpipe", metrics: tuple[object, ...] = METRICS) -> list[Row]:
    rng = random.Random(11)
    rows = []
    for m in metrics:
        for env in ENVS:
            mean = rng.uniform(0.5, 5000.0)
            half = rng.uniform(0.01, 0.1) * mean
            rows.append(
                Row.model_validate(
                    {
                        "env": env,
                        "suite": suite,
                        "metric": m.name,  # type: ignore[attr-defined]
                        "unit": m.unit,  # type: ignore[attr-defined]
                        "higher_is_better": m.higher_is_better,  # type: ignore[attr-defined]
                        "np": None,
                        "n": 3,
                        "mean": mean,
                        "ci_low": mean - half,
                        "ci_high": mean + half,
                    }
                )
            )
    return rows


def _panels(fig: Figure) -> dict[str, Axes]:
    return {ax.get_title().split(" (")[0]: ax for ax in fig.axes}


def test_only_metrics_with_a_message_size_are_taken() -> None:
    rows = _rows() + _rows("hpcc", HPCC_METRICS)
    sized = sized_rows(rows)
    assert {r.suite for r in sized} == {"netpipe"}
    assert {r.metric for r in sized} == {m.name for m in METRICS if m.message_bytes}
    assert sizes_figure(_rows("hpcc", HPCC_METRICS), env_colours(ENVS), "hpcc", 0.97) is None


def test_two_log_panels_one_line_per_environment_in_its_colour() -> None:
    rows = _rows()
    colours = env_colours(ENVS)
    fig = sizes_figure(rows, colours, "netpipe", 0.97)
    assert fig is not None
    panels = _panels(fig)
    assert set(panels) == {"Latency", "Bandwidth"}
    assert panels["Latency"].get_xscale() == "log" and panels["Latency"].get_yscale() == "log"
    assert panels["Bandwidth"].get_xscale() == "log"
    for name, ax in panels.items():
        lines = [ln for ln in ax.get_lines() if ln.get_gid()]
        assert [ln.get_gid() for ln in lines] == list(ENVS), name
        for line in lines:
            env = line.get_gid()
            assert colors.to_hex(line.get_color()) == colors.to_hex(colours[env])
            want = {
                (m.message_bytes, r.mean)
                for r in rows
                for m in METRICS
                if r.env == env
                and r.metric == m.name
                and m.message_bytes
                and r.higher_is_better == (name == "Bandwidth")
            }
            got = set(zip(line.get_xdata(), line.get_ydata(), strict=True))  # type: ignore[arg-type]
            assert got == want
            assert list(line.get_xdata()) == sorted(SIZES)  # type: ignore[arg-type]


def test_bands_span_each_interval() -> None:
    rows = _rows()
    colours = env_colours(ENVS)
    fig = sizes_figure(rows, colours, "netpipe", 0.97)
    assert fig is not None
    ax = _panels(fig)["Latency"]
    for env in ENVS:
        (band,) = [
            c for c in ax.collections if isinstance(c, PolyCollection) and c.get_gid() == env
        ]
        assert colors.to_hex(band.get_facecolor()[0]) == colors.to_hex(colours[env])
        ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
        mine = [r for r in rows if r.env == env and not r.higher_is_better and r.ci_low]
        assert ys.min() == pytest.approx(min(r.ci_low for r in mine if r.ci_low))
        assert ys.max() == pytest.approx(max(r.ci_high for r in mine if r.ci_high))


def test_tick_labels_are_the_sizes() -> None:
    fig = sizes_figure(_rows(), env_colours(ENVS), "netpipe", 0.97)
    assert fig is not None
    labels = [t.get_text() for t in _panels(fig)["Bandwidth"].get_xticklabels()]
    assert labels == [bytes_label(s) for s in SIZES]
    assert labels[0] == "1 B" and labels[-1] == "1 MiB"


def _data(rows: list[Row]) -> ReportData:
    run = RunInfo(
        id=1,
        results_dir="/nonexistent",
        status="finished",
        stop_reason="fixed",
        confidence=0.97,
        started_at=0.0,
        finished_at=1.0,
        elapsed_s=1.0,
        seed=1,
        hpcvm_version="test",
    )
    envs = tuple(
        EnvInfo(
            name=e,
            kind="native" if e == NATIVE else "vm",
            profile=None,
            accel="native" if e == NATIVE else "kvm",
            cpu_model="x",
            vcpus=2,
            memory_bytes=1 << 30,
        )
        for e in ENVS
    )
    return ReportData(run=run, host=None, envs=envs, rows=tuple(rows))


def test_the_report_lists_the_figure_and_the_absolute_one_drops_the_sizes(
    tmp_path: Path,
) -> None:
    data = _data(_rows() + _rows("hpcc", HPCC_METRICS[:2]))
    figures = render_figures(data, tmp_path / "figs-only")
    kinds = [(f.kind, f.path) for f in figures]
    assert ("sizes", "figures/sizes-netpipe.png") in kinds
    assert not [p for k, p in kinds if k == "sizes" and "hpcc" in p]
    # the absolute figure keeps one row of panels (peak bandwidth, 2 hpcc metrics), not
    # one panel per message size (8 rows of panels, over 2000 px high)
    assert ("absolute", "figures/absolute-netpipe.png") in kinds
    height = imread(tmp_path / "figs-only" / "figures/absolute-netpipe.png").shape[0]
    assert height < 2.0 * DPI * 4
    write_report(data, tmp_path, ("md", "html", "json"))
    report = json.loads((tmp_path / "report.json").read_text())
    assert "figures/sizes-netpipe.png" in [f["path"] for f in report["figures"]]
    assert "figures/sizes-netpipe.png" in (tmp_path / "report.md").read_text()
    assert 'data-figure="figures/sizes-netpipe.png"' in (tmp_path / "report.html").read_text()
