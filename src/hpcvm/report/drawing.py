"""What every report figure is drawn with: a figure of a given size, text matplotlib
shows literally, tick labels that never overlap, and the TCG note. figures.py and
sizes.py both draw with these (and sizes.py's figure is one of figures.py's)."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

DPI = 100
TCG_NOTE = "TCG: software emulation, not hardware virtualization"


def text(s: str) -> str:
    """A string matplotlib shows literally (a ``$`` would start mathtext)."""
    return s.replace("$", r"\$")


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


# -- tick label layout ------------------------------------------------------------------


def tick_label_extents(fig: Figure) -> list[list[Bbox]]:
    """Per axes and axis, the window extents of the visible, non-empty tick labels
    (as last drawn: call after ``fig.canvas.draw()``)."""
    groups = []
    for ax in fig.axes:
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            groups.append(
                [t.get_window_extent() for t in labels if t.get_visible() and t.get_text()]
            )
    return groups


def overlapping(boxes: Sequence[Bbox]) -> bool:
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def fit_tick_labels(fig: Figure) -> None:
    """Rotate x tick labels of every axes, step by step, until no two overlap."""
    for angle in (0, 30, 60, 90):
        for ax in fig.axes:
            for t in ax.get_xticklabels():
                t.set_rotation(angle)
                t.set_horizontalalignment("center" if angle in (0, 90) else "right")
                t.set_rotation_mode("anchor" if angle not in (0, 90) else "default")
        fig.canvas.draw()
        if not any(overlapping(boxes) for boxes in tick_label_extents(fig)):
            return
