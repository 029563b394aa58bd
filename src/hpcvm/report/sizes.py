"""Latency and bandwidth against message size, native against each VM, as the studies
drew NetPIPE's curves.

Which rows belong here is data, not names: a metric whose definition in the suite
registry carries a ``message_bytes`` (``bench/suites/registry.py message_bytes``; the database
stores values, not definitions). Two panels, split by the metric's direction:
lower-is-better figures (latency: log-x, log-y, since latencies span decades from
shared memory to large messages) and higher-is-better ones (bandwidth: log-x, linear y,
where the plateau and its height are what a reader compares). One line per environment
(and process count, when a suite has several), in the report's fixed environment colours,
with the interval of each mean as a band drawn from the interval's own bounds.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from hpcvm.bench.suites.registry import message_bytes
from hpcvm.report.drawing import TCG_NOTE, fit_tick_labels, new_figure, text
from hpcvm.report.labels import env_order
from hpcvm.report.model import Row

PANELS = ((False, "Latency"), (True, "Bandwidth"))  # by higher_is_better


def sized_rows(rows: Sequence[Row]) -> list[Row]:
    """Rows of metrics measured at a message size, with a mean to draw."""
    return [
        r
        for r in rows
        if not r.is_detail and r.mean is not None and message_bytes(r.suite, r.metric) is not None
    ]


def bytes_label(nbytes: int) -> str:
    """``1 B``, ``4 KiB``, ``1 MiB``: a tick label (exact binary multiples only)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _unit(row: Row) -> str:
    return "µs" if row.unit == "us" else text(row.unit or "no unit")


def _series(rows: Sequence[Row]) -> dict[tuple[str, int | None], list[tuple[int, Row]]]:
    """(env, np) -> its (message size, row) points in size order, environments in the
    report's order."""
    order = env_order(r.env for r in rows)
    keyed: dict[tuple[str, int | None], list[tuple[int, Row]]] = {}
    for r in sorted(rows, key=lambda r: (order.index(r.env), r.np or 0)):
        size = message_bytes(r.suite, r.metric)
        if size is not None:
            keyed.setdefault((r.env, r.np), []).append((size, r))
    return {key: sorted(points, key=lambda p: p[0]) for key, points in keyed.items()}


# How far past the means a band may widen the axis: beyond it the band runs past the
# frame (a 2-sample interval of a noisy run is 20x its half-range and would flatten
# every line; the table marks such intervals).
WIDEST_LINEAR = 2.0
WIDEST_LOG = 4.0


def _y_limits(rows: Sequence[Row], log_y: bool) -> tuple[float, float]:
    """The means' range widened to the bands, but at most to WIDEST_* of the means; a
    linear axis starts at zero (no bandwidth is negative)."""
    means = [r.mean for r in rows if r.mean is not None]
    lows = [r.ci_low for r in rows if r.ci_low is not None]
    highs = [r.ci_high for r in rows if r.ci_high is not None]
    top = max(means)
    if log_y:
        positive = [v for v in means + lows if v > 0]
        low = max(min(positive), min(means) / WIDEST_LOG) if positive else 1e-3
        high = min(max([top, *highs]), top * WIDEST_LOG)
        return low / 1.2, high * 1.2
    return 0.0, min(max([top, *highs]), top * WIDEST_LINEAR) * 1.05


def _panel(ax: Axes, rows: Sequence[Row], colours: dict[str, str], log_y: bool) -> None:
    series = _series(rows)
    several_np = len({np_ for _, np_ in series}) > 1
    for (env, np_), points in series.items():
        sizes = [float(size) for size, _ in points]
        means = [r.mean if r.mean is not None else float("nan") for _, r in points]
        name = env if not several_np or np_ is None else f"{env}, np {np_}"
        ax.plot(sizes, means, marker="o", ms=3, lw=1.2, color=colours[env], label=text(name))
        ax.lines[-1].set_gid(env)
        bounded = [(s, r) for s, r in points if r.ci_low is not None and r.ci_high is not None]
        if bounded:
            band = ax.fill_between(
                [float(s) for s, _ in bounded],
                [r.ci_low for _, r in bounded if r.ci_low is not None],
                [r.ci_high for _, r in bounded if r.ci_high is not None],
                color=colours[env],
                alpha=0.2,
                linewidth=0,
            )
            band.set_gid(env)
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.set_ylim(*_y_limits(rows, log_y))
    ticks = sorted({size for points in series.values() for size, _ in points})
    ax.xaxis.set_major_locator(FixedLocator([float(t) for t in ticks]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([bytes_label(t) for t in ticks])
    ax.set_xlabel("message size")
    ax.set_ylabel(_unit(rows[0]))
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="best", fontsize=8)


def sizes_figure(
    rows: Sequence[Row], colours: dict[str, str], suite: str, confidence: float
) -> Figure | None:
    """A suite's latency and bandwidth panels against message size; None when none of
    its metrics has a message size."""
    sized = sized_rows(rows)
    panels = [(hib, name) for hib, name in PANELS if any(r.higher_is_better == hib for r in sized)]
    if not panels:
        return None
    fig = new_figure(6.0 * len(panels), 5.0)
    for k, (hib, name) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        mine = [r for r in sized if r.higher_is_better == hib]
        _panel(ax, mine, colours, log_y=not hib)
        direction = "higher is better" if hib else "lower is better"
        ax.set_title(f"{name} ({direction})", fontsize=10)
    title = (
        f"{suite}: latency and bandwidth against message size, "
        f"mean with {confidence * 100:g}% interval (band)"
    )
    if any(r.accel == "tcg" for r in sized):
        title += f"\n{TCG_NOTE}"
    fig.suptitle(text(title))
    fit_tick_labels(fig)
    return fig
