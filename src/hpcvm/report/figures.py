"""The studies' figures from a ReportData, as PNG files (matplotlib, Agg, no display).

- overhead (one per suite): per benchmark and np, grouped bars of each VM's overhead
  against native with its interval as whiskers and a zero line; an unbounded interval
  (Fieller) is a hatched bar with a double arrow, never invented bounds;
- absolute (one per suite): one panel per metric, mean and interval per environment in
  the metric's unit;
- interrupts: interrupts per second against overhead, one point per benchmark and
  environment;
- noise: detour distribution per environment (survival function, log axes);
- sizes (one per suite with metrics per message size, NetPIPE's): latency and bandwidth
  against message size per environment (``sizes.py``); those metrics then leave the
  absolute figure, which would otherwise hold one panel per size;
- scale (``report --scale`` only): predicted overhead against cores, log axis, one panel
  per grain, interval bands, the 10 %-at-1,024-cores target and the measured points.

Every bar and point carries its environment's name as ``gid`` (what tests use to check
colours). Figures are built on ``matplotlib.figure.Figure`` with an Agg canvas, not
pyplot, so nothing global is touched and no display is needed. Environment colours come
from ``labels.env_colours`` (fixed per name). Tick labels are laid out until they do not
overlap (rotated 30, 60, then 90 degrees as needed).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from hpcvm.bench.suites.registry import memory_bound
from hpcvm.model import Frozen
from hpcvm.report.compare import Comparison
from hpcvm.report.drawing import DPI, TCG_NOTE, fit_tick_labels, new_figure, text
from hpcvm.report.labels import env_colours, env_order, label, short_name
from hpcvm.report.model import NATIVE, NoiseCurve, ReportData, Row, ScaleReport
from hpcvm.report.sizes import sized_rows, sizes_figure
from hpcvm.report.variables import differs_line, page_combination

FigureKind = Literal[
    "overhead",
    "overview",
    "pages",
    "absolute",
    "sizes",
    "interrupts",
    "noise",
    "scale",
    "compare",
]
MAX_GROUPS_PER_PANEL = 12
UNBOUNDED_NOTE = "hatched bar with arrow: interval unbounded (no finite interval exists)"


class FigureFile(Frozen):
    """One figure written to disk; ``path`` is relative to the report directory;
    ``differs``: what its environments differ in (report/variables.py), said next to it."""

    kind: FigureKind
    title: str
    path: str
    caption: str
    differs: str = ""


@dataclass(frozen=True)
class Bar:
    """One bar of an overhead-style figure; ``low``/``high`` None: unbounded interval."""

    value: float
    low: float | None
    high: float | None


# -- overhead bars (shared with compare) ------------------------------------------------


def _bar_width(series: int) -> float:
    return 0.8 / max(series, 1)


def whisker(ax: Axes, x: float, low: float, high: float) -> None:
    """An interval's whisker drawn from its own bounds, not as distances from a bar.

    An interval need not contain the estimate (a BCa bootstrap interval may not), and a
    zero-width one can sit a rounding error beside it; matplotlib refuses either as a
    negative error, which once failed a whole report.
    """
    ax.errorbar(
        x,
        (low + high) / 2,
        yerr=abs(high - low) / 2,
        fmt="none",
        ecolor="black",
        elinewidth=1.0,
        capsize=2,
    )


def draw_bars(
    ax: Axes,
    groups: Sequence[str],
    series: Mapping[str, Sequence[Bar | None]],
    colours: dict[str, str],
) -> bool:
    """Grouped bars with asymmetric whiskers; returns whether any bar is unbounded."""
    width = _bar_width(len(series))
    unbounded = False
    for j, (name, bars) in enumerate(series.items()):
        offset = (j - (len(series) - 1) / 2) * width
        for i, bar in enumerate(bars):
            if bar is None:
                continue
            x = i + offset
            colour = colours[name]
            if bar.low is None or bar.high is None:
                unbounded = True
                ax.bar(
                    x, bar.value, width, facecolor="white", edgecolor=colour, hatch="///", gid=name
                )
                ax.annotate(
                    "",
                    xy=(x, 0.98),
                    xytext=(x, 0.02),
                    xycoords=("data", "axes fraction"),
                    textcoords=("data", "axes fraction"),
                    arrowprops={"arrowstyle": "<->", "color": colour, "lw": 1.0},
                )
                continue
            ax.bar(x, bar.value, width, color=colour, gid=name)
            whisker(ax, x, bar.low, bar.high)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), [text(g) for g in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.grid(axis="y", alpha=0.3)
    return unbounded


def legend_handles(
    names: Sequence[str],
    colours: dict[str, str],
    unbounded: bool,
    labels: Mapping[str, str] | None = None,
) -> list[Artist]:
    """One patch per series (``labels``: what to call each, its name by default)."""
    said = labels or {}
    handles: list[Artist] = [Patch(color=colours[n], label=text(said.get(n, n))) for n in names]
    if unbounded:
        handles.append(
            Patch(facecolor="white", edgecolor="black", hatch="///", label="interval unbounded")
        )
    return handles


def bar_panels(
    groups: Sequence[str],
    series: Mapping[str, Sequence[Bar | None]],
    colours: dict[str, str],
    title: str,
    ylabel: str,
    labels: Mapping[str, str] | None = None,
) -> Figure:
    """Bars split into stacked panels of at most MAX_GROUPS_PER_PANEL groups."""
    chunks = [
        range(i, min(i + MAX_GROUPS_PER_PANEL, len(groups)))
        for i in range(0, len(groups), MAX_GROUPS_PER_PANEL)
    ]
    per_group = 0.5 + 0.3 * len(series)
    width = max(7.0, 1.5 + per_group * min(len(groups), MAX_GROUPS_PER_PANEL))
    fig = new_figure(width, 1.2 + 3.4 * len(chunks))
    unbounded = False
    for k, chunk in enumerate(chunks):
        ax = fig.add_subplot(len(chunks), 1, k + 1)
        sub = {name: [bars[i] for i in chunk] for name, bars in series.items()}
        unbounded |= draw_bars(ax, [groups[i] for i in chunk], sub, colours)
        ax.set_ylabel(ylabel)
    fig.suptitle(text(title))
    fig.legend(
        handles=legend_handles(list(series), colours, unbounded, labels),
        loc="outside lower center",
        ncols=min(len(series) + int(unbounded), 2 if labels else 6),
    )
    fit_tick_labels(fig)
    return fig


# -- the report's figures -----------------------------------------------------------------


def _plotted(rows: Sequence[Row]) -> list[Row]:
    """Headline rows with a value (per-CPU details and all-failed rows are tables only)."""
    return [r for r in rows if not r.is_detail and r.mean is not None]


def _group_keys(rows: Sequence[Row]) -> list[tuple[str, int | None]]:
    return list(dict.fromkeys((r.metric, r.np) for r in rows))


def _tcg(rows: Sequence[Row]) -> bool:
    return any(r.accel == "tcg" for r in rows)


def _overhead_series(
    vm: Sequence[Row], keys: Sequence[tuple[str, str, int | None]]
) -> dict[str, Sequence[Bar | None]]:
    """Per environment, its overhead bar for each (suite, metric, np) of ``keys``."""
    index = {(r.env, r.suite, r.metric, r.np): r for r in vm}
    series: dict[str, Sequence[Bar | None]] = {}
    for env in env_order(r.env for r in vm):
        bars: list[Bar | None] = []
        for suite, metric, np_ in keys:
            r = index.get((env, suite, metric, np_))
            bars.append(
                None
                if r is None or r.overhead_pct is None
                else Bar(r.overhead_pct, r.overhead_ci_low, r.overhead_ci_high)
            )
        series[env] = bars
    return series


def _with_overhead(rows: Sequence[Row]) -> list[Row]:
    return [r for r in _plotted(rows) if r.env != NATIVE and r.overhead_pct is not None]


OVERHEAD_LABEL = "overhead vs native (%)\n(positive: slower than native)"


def overhead_figure(
    rows: Sequence[Row], colours: dict[str, str], suite: str, confidence: float
) -> Figure | None:
    """Grouped overhead bars of one suite's rows of every environment but native; None
    when no row has one."""
    vm = _with_overhead(rows)
    if not vm:
        return None
    keys = [(suite, m, n) for m, n in _group_keys(vm)]
    title = f"{suite}: overhead against native, {confidence * 100:g}% interval"
    if _tcg(vm):
        title += f"\n{TCG_NOTE}"
    groups = [label(suite, m, n) for _, m, n in keys]
    return bar_panels(groups, _overhead_series(vm, keys), colours, title, OVERHEAD_LABEL)


def overview_figure(
    rows: Sequence[Row], colours: dict[str, str], confidence: float
) -> Figure | None:
    """Every environment of the run against native in one figure: each suite's
    headline figures (not those per message size, which the sizes figure draws); None
    with fewer than two suites or environments to set side by side."""
    vm = [r for r in _with_overhead(rows) if r not in sized_rows(rows)]
    suites = list(dict.fromkeys(r.suite for r in vm))
    if len(suites) < 2 and len({r.env for r in vm}) < 2:
        return None
    keys = list(dict.fromkeys((r.suite, r.metric, r.np) for r in vm))
    several = len(suites) > 1
    groups = [(f"{s}: " if several else "") + label(s, m, n) for s, m, n in keys]
    title = f"Every environment against native, {confidence * 100:g}% interval"
    if _tcg(vm):
        title += f"\n{TCG_NOTE}"
    return bar_panels(groups, _overhead_series(vm, keys), colours, title, OVERHEAD_LABEL)


def pages_figure(
    data: ReportData, colours: dict[str, str], confidence: float
) -> tuple[Figure, list[str]] | None:
    """The memory-bound benchmarks' overhead (bench/suites/registry.py ``memory_bound``: STREAM,
    RandomAccess) with one bar series per VM page-size combination (host page size
    under guest RAM x the guest's THP mode, as observed after boot), as the study of
    hardware-assisted paging drew them; None unless the run's VMs have at least two
    combinations. Also returns the environments drawn."""
    vms = {e.name: e for e in data.envs if e.kind == "vm"}
    rows = [
        r for r in _with_overhead(data.rows) if r.env in vms and memory_bound(r.suite, r.metric)
    ]
    drawn = [vms[n] for n in env_order(r.env for r in rows)]
    if len({page_combination(e) for e in drawn}) < 2:
        return None
    keys = list(dict.fromkeys((r.suite, r.metric, r.np) for r in rows))
    groups = [label(s, m, n) for s, m, n in keys]
    labels = {e.name: f"{e.name}: {page_combination(e)}" for e in drawn}
    title = (
        "Memory-bound benchmarks: overhead per page-size combination\n"
        f"(host page size x guest THP), {confidence * 100:g}% interval"
    )
    if _tcg(rows):
        title += f"\n{TCG_NOTE}"
    fig = bar_panels(groups, _overhead_series(rows, keys), colours, title, OVERHEAD_LABEL, labels)
    return fig, [e.name for e in drawn]


def _axis_unit(row: Row) -> str:
    if not row.unit:
        return "value (no unit)"
    return "µs" if row.unit == "us" else text(row.unit)


def absolute_figure(
    rows: Sequence[Row], colours: dict[str, str], suite: str, confidence: float
) -> Figure | None:
    """One panel per metric of a suite: mean and interval per environment and np."""
    plotted = _plotted(rows)
    metrics = list(dict.fromkeys(r.metric for r in plotted))
    if not metrics:
        return None
    envs = env_order(r.env for r in plotted)
    cols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / cols)
    # at least 6.4 in wide: a single panel must still hold the title and TCG note
    fig = new_figure(max(6.4, 4.3 * cols), 1.0 + 2.9 * nrows)
    for k, metric in enumerate(metrics):
        ax = fig.add_subplot(nrows, cols, k + 1)
        mine = [r for r in plotted if r.metric == metric]
        nps = list(dict.fromkeys(r.np for r in mine))
        _absolute_panel(ax, mine, nps, envs, colours)
        direction = "higher is better" if mine[0].higher_is_better else "lower is better"
        ax.set_title(text(f"{short_name(suite, metric)} ({direction})"), fontsize=10)
        ax.set_ylabel(_axis_unit(mine[0]))
    title = f"{suite}: mean with {confidence * 100:g}% interval per environment"
    if _tcg(plotted):
        title += f"\n{TCG_NOTE}"
    fig.suptitle(text(title))
    fig.legend(
        handles=legend_handles(envs, colours, False),
        loc="outside lower center",
        ncols=min(len(envs), 6),
    )
    fit_tick_labels(fig)
    return fig


def _absolute_panel(
    ax: Axes,
    rows: Sequence[Row],
    nps: Sequence[int | None],
    envs: Sequence[str],
    colours: dict[str, str],
) -> None:
    width = _bar_width(len(envs))
    index = {(r.env, r.np): r for r in rows}
    for j, env in enumerate(envs):
        offset = (j - (len(envs) - 1) / 2) * width
        for i, np_ in enumerate(nps):
            r = index.get((env, np_))
            if r is None or r.mean is None:
                continue
            ax.bar(i + offset, r.mean, width, color=colours[env], gid=env)
            if r.ci_low is not None and r.ci_high is not None:
                whisker(ax, i + offset, r.ci_low, r.ci_high)
    ax.set_xticks(range(len(nps)), ["all CPUs" if n is None else f"np {n}" for n in nps])
    ax.grid(axis="y", alpha=0.3)


MARKERS = "osD^v<>pP*Xh"
MAX_POINT_LABELS = 30  # beyond this, labels would cover the points


def interrupts_figure(data: ReportData, colours: dict[str, str]) -> Figure | None:
    """Interrupts per second against overhead, one point per benchmark and environment;
    None without interrupt evidence."""
    points = []
    for r in _plotted(data.rows):
        x = r.interrupts_per_s if r.interrupts_per_s is not None else r.host_interrupts_per_s
        y = 0.0 if r.env == NATIVE else r.overhead_pct
        if x is not None and y is not None:
            points.append((r, x, y))
    if not points:
        return None
    suites = list(dict.fromkeys(r.suite for r, _, _ in points))
    fig = new_figure(8.0, 5.2)
    ax = fig.add_subplot(1, 1, 1)
    for r, x, y in points:
        marker = MARKERS[suites.index(r.suite) % len(MARKERS)]
        ax.scatter(x, y, color=colours[r.env], marker=marker, s=30, gid=r.env)
        if len(points) <= MAX_POINT_LABELS:
            ax.annotate(
                text(label(r.suite, r.metric, r.np)),
                (x, y),
                xytext=(4, 3),
                textcoords="offset points",
                fontsize=7,
                color=colours[r.env],
            )
    positive = [x for _, x, _ in points if x > 0]
    if positive and max(positive) / min(positive) > 100 and len(positive) == len(points):
        ax.set_xscale("log")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel(
        "interrupts per second (guest count for VMs, host count natively or when the "
        "guest count is missing)"
    )
    ax.set_ylabel("overhead vs native (%)")
    ax.grid(alpha=0.3)
    envs = env_order(r.env for r, _, _ in points)
    handles = legend_handles(envs, colours, False)
    handles += [
        ax.scatter([], [], color="black", marker=MARKERS[i % len(MARKERS)], label=text(s))
        for i, s in enumerate(suites)
    ]
    ax.legend(handles=handles, loc="best", fontsize=8)
    title = "Interrupts per second against overhead (one point per benchmark and environment)"
    if _tcg(data.rows):
        title += f"\n{TCG_NOTE}"
    fig.suptitle(title, fontsize=11)
    fit_tick_labels(fig)
    return fig


def noise_figure(curves: Sequence[NoiseCurve], colours: dict[str, str], tcg: bool) -> Figure | None:
    """Survival function of detours per environment on log axes; None without data."""
    if not curves:
        return None
    fig = new_figure(8.0, 5.0)
    ax = fig.add_subplot(1, 1, 1)
    for c in sorted(curves, key=lambda c: env_order([x.env for x in curves]).index(c.env)):
        ax.step(
            c.detour_us,
            c.fraction_above,
            where="post",
            color=colours[c.env],
            label=text(f"{c.env} ({c.quanta:,} quanta, {c.samples} runs)"),
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("detour: quantum duration above its CPU's fastest (µs)")
    ax.set_ylabel("fraction of quanta delayed more than x")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="best", fontsize=8)
    title = "Noise: detour distribution per environment (fixed work quanta)"
    if tcg:
        title += f"\n{TCG_NOTE}"
    fig.suptitle(title, fontsize=11)
    fit_tick_labels(fig)
    return fig


TARGET_PCT, TARGET_CORES = 10.0, 1024  # the HPC-cloud study's goal


def _scale_series(
    scale: ScaleReport, grain: float
) -> dict[str, tuple[list[int], list[float], list[float], list[float]]]:
    """Per environment: cores, value, low, high. Each VM's overhead against native when
    native was predicted; otherwise every environment's slowdown against a quiet machine."""
    out: dict[str, tuple[list[int], list[float], list[float], list[float]]] = {}
    overheads = [o for o in scale.overheads if o.grain_ns == grain]
    if overheads:
        for env in env_order(o.env for o in overheads):
            mine = [o for o in overheads if o.env == env]
            out[env] = (
                [o.cores for o in mine],
                [o.overhead_pct for o in mine],
                [o.low_pct for o in mine],
                [o.high_pct for o in mine],
            )
        return out
    for c in scale.curves:
        if c.grain_ns == grain:
            out[c.env] = (
                [p.cores for p in c.points],
                [p.slowdown_pct for p in c.points],
                [p.slowdown_low_pct for p in c.points],
                [p.slowdown_high_pct for p in c.points],
            )
    return out


def _grain_text(ns: float) -> str:
    return f"{ns / 1e6:g} ms" if ns >= 1e6 else f"{ns / 1e3:g} µs"


def _scale_panel(ax: Axes, scale: ScaleReport, grain: float, colours: dict[str, str]) -> bool:
    """One grain's curves with bands and measured points; whether they are overheads."""
    series = _scale_series(scale, grain)
    against_native = bool(scale.overheads) and any(o.grain_ns == grain for o in scale.overheads)
    for env, (cores, value, low, high) in series.items():
        ax.fill_between(cores, low, high, color=colours[env], alpha=0.2, linewidth=0)
        ax.plot(cores, value, color=colours[env], marker=".", gid=env, label=text(env))
    for m in scale.measured:
        y = m.overhead_pct if against_native else m.slowdown_pct
        if scale.grain_of(m) != grain or y is None or m.env not in series:
            continue
        ax.scatter(
            m.cores,
            y,
            color=colours[m.env],
            marker="D",
            s=40,
            edgecolor="black",
            zorder=5,
            gid=m.env,
        )
    ax.axhline(TARGET_PCT, color="#c62828", linestyle="--", linewidth=1.0)
    ax.axvline(TARGET_CORES, color="#c62828", linestyle=":", linewidth=1.0)
    ax.scatter([TARGET_CORES], [TARGET_PCT], color="#c62828", marker="*", s=90, zorder=6)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlim(0.8, max(scale.cores) * 1.25)  # the end points' markers whole
    ax.set_title(f"grain {_grain_text(grain)}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    return against_native


def scale_figure(scale: ScaleReport, colours: dict[str, str], tcg: bool) -> Figure | None:
    """Predicted overhead (or slowdown) against core count, one panel per grain."""
    grains = [g for g in scale.grains_ns if _scale_series(scale, g)]
    if not grains:
        return None
    cols = min(2, len(grains))
    nrows = math.ceil(len(grains) / cols)
    fig = new_figure(6.0 * cols, 1.4 + 3.6 * nrows)
    against = False
    for k, grain in enumerate(grains):
        ax = fig.add_subplot(nrows, cols, k + 1)
        against |= _scale_panel(ax, scale, grain, colours)
        ax.set_xlabel("cores (ranks), log scale")
        ax.set_ylabel("predicted overhead vs native (%)" if against else "slowdown vs quiet (%)")
    envs = env_order({e for g in grains for e in _scale_series(scale, g)})
    handles = legend_handles(envs, colours, False)
    handles.append(
        Line2D(
            [],
            [],
            color="#c62828",
            linestyle="--",
            marker="*",
            label=f"target: {TARGET_PCT:g} % at {TARGET_CORES} cores",
        )
    )
    if scale.measured:
        handles.append(
            Line2D(
                [], [], color="black", marker="D", linestyle="none", label="measured (bsp suite)"
            )
        )
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4))
    what = "overhead against native" if against else "slowdown against a quiet machine"
    title = f"Bulk-synchronous code at scale: predicted {what} from measured noise"
    if tcg:
        title += f"\n{TCG_NOTE}"
    fig.suptitle(title, fontsize=11)
    return fig


# -- writing ---------------------------------------------------------------------------


def save(fig: Figure, path: Path) -> None:
    """Write the PNG under a temporary name, then rename it into place (never a
    half-written figure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=DPI)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s).strip("-") or "suite"


def render_figures(data: ReportData, out_dir: Path, subdir: str = "figures") -> list[FigureFile]:
    """Write every figure of the report as PNG under ``out_dir/subdir``; the list says
    what each shows and what its environments differ in. Figures without data (no VM,
    no interrupts, no noise) are skipped."""
    colours = env_colours(data.env_names)
    conf = data.run.confidence
    made: list[FigureFile] = []
    bar_caption = f"whiskers: {conf * 100:g}% interval (Fieller); {UNBOUNDED_NOTE}."

    def emit(
        fig: Figure | None,
        kind: FigureKind,
        name: str,
        title: str,
        caption: str,
        envs: Sequence[str] = (),
    ) -> None:
        if fig is None:
            return
        rel = f"{subdir}/{name}.png"
        save(fig, out_dir / rel)
        drawn = [e for e in data.envs if e.name in envs]
        differs = differs_line(drawn) if drawn else ""
        made.append(FigureFile(kind=kind, title=title, path=rel, caption=caption, differs=differs))

    suites = list(dict.fromkeys(r.suite for r in data.rows))
    every = data.env_names
    pages = pages_figure(data, colours, conf)
    if pages is not None:
        emit(
            pages[0],
            "pages",
            "pages-memory-bound",
            "Memory-bound benchmarks per page-size combination",
            "Bars: overhead against native of STREAM and RandomAccess, one series per VM and "
            "its page-size combination (host page size under guest RAM x guest THP mode, both "
            f"as observed in the running VM); {bar_caption}",
            [*pages[1], NATIVE],
        )
    emit(
        overview_figure(data.rows, colours, conf),
        "overview",
        "overhead-all",
        "Every environment against native",
        "Bars: overhead against native of every environment of the run (containers and VMs) "
        f"for each suite's headline figures; {bar_caption}",
        every,
    )
    for suite in suites:
        rows = [r for r in data.rows if r.suite == suite]
        emit(
            overhead_figure(rows, colours, suite, conf),
            "overhead",
            f"overhead-{_slug(suite)}",
            f"Overhead against native: {suite}",
            f"Bars: overhead of each environment against native (positive: slower); {bar_caption}",
            [r.env for r in rows],
        )
    for suite in suites:
        rows = [r for r in data.rows if r.suite == suite]
        sized = sized_rows(rows)
        emit(
            sizes_figure(rows, colours, suite, conf),
            "sizes",
            f"sizes-{_slug(suite)}",
            f"Latency and bandwidth against message size: {suite}",
            "Lines: mean per message size and environment (native, containers, VMs); "
            f"bands: {conf * 100:g}% Student-t interval of each mean (running past the frame when "
            "wider than the plot). Latency on log axes.",
            [r.env for r in sized],
        )
        rows = [r for r in rows if r not in sized]
        emit(
            absolute_figure(rows, colours, suite, conf),
            "absolute",
            f"absolute-{_slug(suite)}",
            f"Absolute figures: {suite}",
            f"Mean per environment in the metric's unit; whiskers: {conf * 100:g}% "
            "Student-t interval of the mean (none with a single sample).",
            [r.env for r in rows],
        )
    emit(
        interrupts_figure(data, colours),
        "interrupts",
        "interrupts",
        "Interrupts per second against overhead",
        "Mean interrupts per second during the benchmark's samples (sum over sources) "
        "against its overhead; native points lie on zero overhead.",
        every,
    )
    emit(
        noise_figure(data.noise, colours, any(e.accel == "tcg" for e in data.envs)),
        "noise",
        "noise-detours",
        "Noise: detour distribution",
        "Fraction of fixed work quanta delayed by more than x, over all CPUs and runs.",
        [c.env for c in data.noise],
    )
    if data.scale is not None:
        conf_pct = f"{data.scale.curves[0].confidence * 100:g}%" if data.scale.curves else ""
        emit(
            scale_figure(data.scale, colours, any(e.accel == "tcg" for e in data.envs)),
            "scale",
            "scale-overhead",
            "At scale: predicted overhead against cores",
            "Lines: predicted overhead of a bulk-synchronous code (a grain of work between "
            "allreduces) against native, from each environment's measured noise "
            f"(docs/scale.md); bands: {conf_pct} bootstrap interval over the measured "
            "traces; dashed red: the 10 % target at 1,024 cores; diamonds: measured by the "
            "bsp suite at the ranks the run had. Symmetric-log y axis (linear below 1 %).",
            [c.env for c in data.scale.curves],
        )
    return made


def compare_figure(c: Comparison, suite: str, colours: dict[str, str]) -> Figure | None:
    """Change from run A to run B per benchmark and environment, with whiskers."""
    rows = [
        r for r in c.rows if r.suite == suite and "@" not in r.metric and r.change_pct is not None
    ]
    if not rows:
        return None
    keys = list(dict.fromkeys((r.metric, r.np) for r in rows))
    index = {(r.env, r.metric, r.np): r for r in rows}
    series: dict[str, list[Bar | None]] = {}
    for env in env_order(r.env for r in rows):
        bars: list[Bar | None] = []
        for metric, np_ in keys:
            r = index.get((env, metric, np_))
            bars.append(
                None
                if r is None or r.change_pct is None
                else Bar(r.change_pct, r.change_ci_low, r.change_ci_high)
            )
        series[env] = bars
    title = f"{suite}: run B against run A, {c.confidence * 100:g}% interval"
    groups = [label(suite, m, n) for m, n in keys]
    return bar_panels(groups, series, colours, title, "change B vs A (%)\n(positive: B worse)")


def render_compare_figures(
    c: Comparison, out_dir: Path, subdir: str = "figures"
) -> list[FigureFile]:
    """One change figure per suite present in both runs, as PNG under ``out_dir/subdir``."""
    colours = env_colours([*c.a.env_names, *c.b.env_names])
    made = []
    for suite in dict.fromkeys(r.suite for r in c.rows):
        fig = compare_figure(c, suite, colours)
        if fig is None:
            continue
        rel = f"{subdir}/compare-{_slug(suite)}.png"
        save(fig, out_dir / rel)
        made.append(
            FigureFile(
                kind="compare",
                title=f"Run B against run A: {suite}",
                path=rel,
                caption="Bars: change of each benchmark from run A to run B (positive: B is "
                f"worse); whiskers: {c.confidence * 100:g}% Fieller interval of the ratio "
                f"of means; {UNBOUNDED_NOTE}.",
            )
        )
    return made
