"""Figures readable at a glance: no overlapping tick labels at 10 metrics x 4
environments, labels inside the canvas, axis labels with units, a legend, unbounded
intervals drawn as such.

These tests check layout, so their rows are built here rather than measured: ten real
hpcc metric names (the longest labels hpcvm draws) at np 16, native and four VM
profiles, values from a seeded random generator. No number is asserted.
"""

from __future__ import annotations

import random
from itertools import combinations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

from hpcvm.bench.suites.hpcc.suite import COMMUNICATION_METRICS, METRICS
from hpcvm.report.drawing import fit_tick_labels, new_figure
from hpcvm.report.figures import absolute_figure, overhead_figure
from hpcvm.report.labels import env_colours, label
from hpcvm.report.model import NATIVE, Row

SUITE = "hpcc"
VMS = ("vm:naive", "vm:pinned", "vm:numa", "vm:hpc")
ENVS = (NATIVE, *VMS)
# Ten metrics with the longest short labels ("PingPong lat max 16", "Ring bw rand 16"...).
CHOSEN = sorted((*METRICS, *COMMUNICATION_METRICS), key=lambda m: -len(label(SUITE, m.name, 16)))[
    :10
]


def _rows(unbounded: tuple[str, str] | None = None) -> list[Row]:
    rng = random.Random(16)
    rows = []
    for m in CHOSEN:
        for env in ENVS:
            mean = rng.uniform(1.0, 100.0)
            half = rng.uniform(0.01, 0.2) * mean
            row: dict[str, object] = {
                "env": env,
                "suite": SUITE,
                "metric": m.name,
                "unit": m.unit,
                "higher_is_better": m.higher_is_better,
                "np": 16,
                "n": 5,
                "mean": mean,
                "ci_low": mean - half,
                "ci_high": mean + half,
            }
            if env != NATIVE:
                pct = rng.uniform(-5.0, 60.0)
                bounded = unbounded != (env, m.name)
                row |= {
                    "overhead_pct": pct,
                    "overhead_ci_low": pct - 4.0 if bounded else None,
                    "overhead_ci_high": pct + 6.0 if bounded else None,
                    "significant": bounded and pct > 4.0,
                }
            rows.append(Row.model_validate(row))
    return rows


def label_boxes(fig: Figure) -> list[tuple[str, list[Bbox]]]:
    """Tick label extents per axis, measured with the Agg renderer (independent of the
    layout code under test)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # type: ignore[no-untyped-call]
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    out = []
    for i, ax in enumerate(fig.axes):
        for axis, labels in (("x", ax.get_xticklabels()), ("y", ax.get_yticklabels())):
            shown: list[Text] = [t for t in labels if t.get_visible() and t.get_text()]
            out.append((f"axes {i} {axis}", [t.get_window_extent(renderer) for t in shown]))
    return out


def overlaps(fig: Figure) -> list[str]:
    found = []
    for name, boxes in label_boxes(fig):
        for a, b in combinations(boxes, 2):
            if a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1:
                found.append(f"{name}: {a} overlaps {b}")
    return found


def outside(fig: Figure) -> list[str]:
    width, height = fig.canvas.get_width_height()
    return [
        f"{name}: {b}"
        for name, boxes in label_boxes(fig)
        for b in boxes
        if b.x0 < -1 or b.y0 < -1 or b.x1 > width + 1 or b.y1 > height + 1
    ]


@pytest.fixture(scope="module")
def colours() -> dict[str, str]:
    return env_colours(ENVS)


def test_overhead_figure_at_10_metrics_by_4_vms_is_readable(colours: dict[str, str]) -> None:
    fig = overhead_figure(_rows(), colours, SUITE, 0.97)
    assert fig is not None
    assert overlaps(fig) == []
    assert outside(fig) == []
    [ax] = fig.axes
    assert len([t for t in ax.get_xticklabels() if t.get_text()]) == 10
    assert "%" in ax.get_ylabel()
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert legend == set(VMS)


def test_absolute_figure_at_10_metrics_by_5_envs_is_readable(colours: dict[str, str]) -> None:
    fig = absolute_figure(_rows(), colours, SUITE, 0.97)
    assert fig is not None
    assert overlaps(fig) == []
    assert outside(fig) == []
    assert len(fig.axes) == 10
    units = {m.unit for m in CHOSEN}
    for ax in fig.axes:
        assert ax.get_ylabel().replace("µs", "us") in units
    assert {t.get_text() for t in fig.legends[0].get_texts()} == set(ENVS)


def test_the_overlap_check_sees_crowded_labels(colours: dict[str, str]) -> None:
    """The check above is live: the same labels squeezed unrotated onto a narrow axis
    are reported as overlapping."""
    fig = Figure(figsize=(3.0, 2.0))
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(range(10), range(10))
    ax.set_xticks(range(10), [label(SUITE, m.name, 16) for m in CHOSEN])
    assert overlaps(fig)


def test_an_unbounded_interval_is_a_hatched_bar_with_an_arrow(colours: dict[str, str]) -> None:
    target = ("vm:numa", CHOSEN[3].name)
    fig = overhead_figure(_rows(unbounded=target), colours, SUITE, 0.97)
    assert fig is not None
    [ax] = fig.axes
    hatched = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch()]
    assert len(hatched) == 1
    assert hatched[0].get_edgecolor()[:3] == pytest.approx(
        tuple(int(colours["vm:numa"][i : i + 2], 16) / 255 for i in (1, 3, 5))
    )
    arrows = [c for c in ax.get_children() if isinstance(c, Annotation) and c.arrow_patch]
    assert len(arrows) == 1
    assert "interval unbounded" in {t.get_text() for t in fig.legends[0].get_texts()}
    # 39 bounded bars with whiskers; the unbounded one has none.
    whiskers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(whiskers) == 10 * len(VMS) - 1


@pytest.mark.parametrize(
    ("pct", "low", "high"),
    [
        # A zero-width interval a rounding error above its estimate (all samples equal).
        (12.5, 12.5 + 1e-12, 12.5 + 1e-12),
        # A BCa bootstrap interval that does not contain the ratio of means.
        (3.0, 4.0, 9.0),
    ],
)
def test_a_whisker_spans_its_interval_even_when_the_estimate_lies_outside(
    colours: dict[str, str], pct: float, low: float, high: float
) -> None:
    rows = [
        r.model_copy(update={"overhead_pct": pct, "overhead_ci_low": low, "overhead_ci_high": high})
        if r.env == "vm:hpc" and r.metric == CHOSEN[0].name
        else r
        for r in _rows()
    ]
    fig = overhead_figure([r for r in rows if r.env in (NATIVE, "vm:hpc")], colours, SUITE, 0.97)
    assert fig is not None
    # One series: the first metric's whisker is the one at x = 0.
    first = min(
        (c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)),
        key=lambda c: abs(c.lines[2][0].get_segments()[0][0][0]),
    )
    [[(_, y0), (_, y1)]] = first.lines[2][0].get_segments()
    assert (min(y0, y1), max(y0, y1)) == pytest.approx((low, high), abs=1e-9)


def test_crowded_labels_are_rotated_until_they_fit() -> None:
    fig = new_figure(6.0, 3.0)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(range(10), range(10))
    ax.set_xticks(range(10), [label(SUITE, m.name, 16) for m in CHOSEN])
    fit_tick_labels(fig)
    assert ax.get_xticklabels()[0].get_rotation() > 0
    assert overlaps(fig) == []
