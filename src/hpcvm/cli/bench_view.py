"""Terminal tables of a bench run: the conditions, then one table per metric.

Each metric's table lists env, np, n, mean ± half-width with the interval, overhead %
with its interval and a significance mark, interrupts per second (the guest's own for a
VM, the host's natively) and the environment's noise (from the noise suite: time lost
and the longest detour). The conditions come first and the TCG warning both first and
last, so nobody reads the figures without them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import (
    Console,
    ConsoleOptions,
    Group,
    JustifyMethod,
    OverflowMethod,
    RenderableType,
    RenderResult,
)
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from hpcvm.bench.results.failures import CellFailures
from hpcvm.bench.results.results import ResultRow, noise_by_env
from hpcvm.bench.run.session import TCG_WARNING
from hpcvm.bench.suites.registry import kind_of, short_name
from hpcvm.store import EnvironmentRecord, RunRecord
from hpcvm.units import format_cpu_list

SIGNIFICANT = "*"
TOO_NOISY = "(too noisy)"
DISTRUST = "!"
WIDE = 160
# A cell too narrow for a word (a terminal of 80 columns, eleven conditions) folds the
# word onto the next line rather than cutting it with an ellipsis: no value is lost.
FOLD: OverflowMethod = "fold"
NATURAL = 10_000  # columns: wider than any table, to measure one's natural width


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}%"


def _interval(low: float | None, high: float | None, pct: bool = False) -> str:
    if low is None or high is None:
        return "-"
    if pct:
        return f"[{low:+.2f}%, {high:+.2f}%]"
    return f"[{low:.4g}, {high:.4g}]"


def _noise(figures: dict[str, float | None] | None) -> str:
    if not figures:
        return "-"
    lost = figures.get("NoiseTimeLost_pct")
    detour = figures.get("NoiseMaxDetour_usec")
    return f"lost {_num(lost, 3)}%, max {_num(detour, 3)} us"


def host_pus(run: RunRecord, env: EnvironmentRecord) -> str:
    """Where an environment ran: native's PUs and nodes and how they were held (a
    cpuset, or CPU affinity for a user who may not make one; as recorded with the run;
    a container is confined to the same), a VM's vCPU pins (from its plan), or "any"
    where nothing confined it."""
    if env.kind != "vm":
        native = run.args.get("native")
        cpus = native.get("cpus") if isinstance(native, dict) else None
        mems = native.get("mems") if isinstance(native, dict) else None
        if not cpus:
            return "any"
        how = native.get("confine", "cpuset") if isinstance(native, dict) else "cpuset"
        if env.kind == "container" and env.versions.get("container_rootless") == "yes":
            how = "affinity"  # a rootless container has no cgroup (bench/envs/container.py)
        if how != "cpuset":
            return f"{format_cpu_list(cpus)} (nodes {format_cpu_list(mems or [])}; {how})"
        return f"{format_cpu_list(cpus)} (nodes {format_cpu_list(mems or [])})"
    placements = (env.plan or {}).get("placements", [])
    pins = [p.get("host_pu") for p in placements if p.get("host_pu") is not None]
    return format_cpu_list(pins) if pins else "any (unpinned)"


def runtime_of(env: EnvironmentRecord) -> str:
    """What runs the environment, with its version: a container's OCI runtime, a VM's
    QEMU (or its backend), nothing natively."""
    versions = env.versions
    if env.kind == "container":
        return versions.get("container_runtime", "?")
    if env.kind == "vm":
        backend = versions.get("backend", "qemu")
        qemu = versions.get("qemu")
        return f"{backend} (QEMU {qemu})" if qemu and backend != "qemu" else f"QEMU {qemu or '?'}"
    return "-"


def pages_of(env: EnvironmentRecord) -> str:
    """A VM's pages as observed after boot: the host's under guest RAM (with what of
    it the host's THP backs) and the guest's THP mode; "-" elsewhere."""
    if env.kind != "vm":
        return "-"
    host = env.versions.get("host_page", "?")
    thp = env.versions.get("guest_ram_on_host_thp", "0")
    if thp not in ("0", ""):
        host += f" ({thp} on THP)"
    return f"{host} / THP {env.versions.get('guest_thp', '?')}"


def differs_in(env: EnvironmentRecord) -> str:
    """What a variant changes of its profile (bench/envs/variants.py), from the variant
    stored with it; "-" for a profile as it is, native and a container."""
    from hpcvm.bench.envs.variants import KEYS

    parts = [
        f"{k.variable} {k.show(env.variant[k.name])}"
        for k in KEYS.values()
        if k.name in env.variant
    ]
    return ", ".join(parts) or "-"


CONDITIONS = (
    "env",
    "accel",
    "runtime",
    "CPU model",
    "vCPUs",
    "host PUs",
    "memory",
    "pages host/guest",
    "differs in",
    "n (reps)",
    "failed",
)


class _Conditions:
    """The conditions table, one row per environment where the console is wide enough
    for it, else turned on its side (one row per condition, one column per environment):
    eleven columns squeezed into 80 would fold every value into slivers."""

    def __init__(self, title: str, cells: list[list[str]]) -> None:
        self.title = title
        self.cells = cells  # one list per environment, in CONDITIONS order

    def wide(self) -> Table:
        table = Table(title=self.title, box=None, header_style="bold")
        for col in CONDITIONS:
            table.add_column(col, overflow=FOLD)
        for row in self.cells:
            table.add_row(*row)
        return table

    def tall(self) -> Table:
        table = Table(title=self.title, box=None, header_style="bold")
        table.add_column("env", style="bold", overflow=FOLD)
        for row in self.cells:
            table.add_column(row[0], overflow=FOLD)
        for k, name in enumerate(CONDITIONS[1:], start=1):
            table.add_row(name, *(row[k] for row in self.cells))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = self.wide()
        unbounded = options.update_width(NATURAL)  # a measure is capped at the width given
        fits = Measurement.get(console, unbounded, wide).maximum <= options.max_width
        yield wide if fits else self.tall()


def conditions(
    run: RunRecord,
    envs: Sequence[EnvironmentRecord],
    rows: Sequence[ResultRow],
    failures: Sequence[CellFailures] = (),
) -> RenderableType:
    """Accelerator, CPU model, confidence, n and stopping rule, in a small table."""
    cells = []
    for e in envs:
        ns = [r.n for r in rows if r.env == e.name and not r.detail]
        failed = sum(f.failed for f in failures if f.env == e.name)
        cells.append(
            [
                e.name,
                e.accel,
                runtime_of(e),
                e.cpu_model or "-",
                str(e.vcpus),
                host_pus(run, e),
                f"{e.memory_bytes / 2**30:.1f} GiB",
                pages_of(e),
                differs_in(e),
                f"{min(ns)}-{max(ns)}" if ns and min(ns) != max(ns) else str(ns[0] if ns else 0),
                str(failed) if failed else "-",
            ]
        )
    table = _Conditions(f"run {run.id}: conditions", cells)
    stop = run.stop_reason or "-"
    if run.stop_detail:
        stop += f" ({run.stop_detail})"
    status = run.status_text
    if failures and run.status == "finished":
        status = "finished with failures"
    tuning = run.args.get("tuning")
    tuned = tuning.get("hpcvm_tune", "?") if isinstance(tuning, dict) else "not recorded"
    lines = Text(
        f"host tuning (hpcvm tune): {tuned}; "
        f"confidence {run.confidence:g}; stopped by: {stop}; status {status}; "
        f"seed {run.seed}; measured {run.elapsed_s:.0f} s"
    )
    return Group(table, lines)


def warnings_block(
    run: RunRecord, envs: Sequence[EnvironmentRecord], *, run_warnings: bool = True
) -> RenderableType:
    """The TCG warning first whenever an environment was emulated (from the recorded
    accelerators, not from any text), then, unless left out, the run's own warnings."""
    out = Text()
    if any(e.accel == "tcg" for e in envs):
        out.append(f"WARNING: {TCG_WARNING}\n", style="bold red")
    for w in run.warnings if run_warnings else ():
        out.append(f"WARNING: {w}\n", style="yellow")
    return out


def _mean_cell(r: ResultRow) -> str:
    if r.mean is None:
        return "FAILED" if r.failed else "-"
    if r.half_width is None:
        return f"{r.mean:.4g}"
    noisy = f" {TOO_NOISY}" if r.interval_note else ""
    return f"{r.mean:.4g} ± {r.half_width:.2g} {_interval(r.ci_low, r.ci_high)}{noisy}"


def _overhead_cell(r: ResultRow) -> str:
    if r.env == "native":
        return "baseline"
    mark = f" {DISTRUST}" if r.trust_note else ""
    if r.overhead_pct is None:
        return ("unbounded" if r.n and r.overhead_note.startswith("interval") else "-") + mark
    interval = _interval(r.overhead_ci_low, r.overhead_ci_high, pct=True)
    return f"{_pct(r.overhead_pct)} {interval}{mark}"


def _robust_cell(r: ResultRow) -> str:
    if r.env == "native":
        return "baseline"
    if r.robust_pct is None:
        return "-"
    if r.robust_ci_low is None:
        return f"{_pct(r.robust_pct)} (no interval)"
    return f"{_pct(r.robust_pct)} {_interval(r.robust_ci_low, r.robust_ci_high, pct=True)}"


def _n_cell(r: ResultRow) -> str:
    text = str(r.n)
    if r.outliers:
        text += f" ({r.outliers} outl.)"
    return text + (f"+{r.failed} failed" if r.failed else "")


def trust_notes(rows: Sequence[ResultRow]) -> list[str]:
    """One line per row whose mean's interval should not be trusted."""
    return [
        f"{DISTRUST} {r.env} np {'-' if r.np is None else r.np}: {r.trust_note}"
        for r in rows
        if r.trust_note
    ]


EXTREME_NOTE = "extreme statistic: its mean has an interval, but --reps auto does not judge it"


def is_extreme(suite: str, metric: str) -> bool:
    """Whether the suite's kind defines this metric as an extreme statistic (a maximum,
    a p99.9 of each sample: no repetition count narrows its interval to a target);
    per-CPU details (``name@cpu1``) share their summary metric's definition."""
    kind = kind_of(suite)
    name = metric.split("@", 1)[0]
    return kind is not None and any(m.name == name and m.extreme for m in kind.metrics)


def metric_title(suite: str, metric: str, unit: str) -> str:
    """The stored metric name (what ``results`` and the exports use), then what it shows
    in its kind's own words and its unit: "Time_sec (CG time, s)"."""
    label = short_name(suite, metric)
    inner = ", ".join(x for x in (label if label != metric else None, unit) if x)
    return f"{metric} ({inner})" if inner else metric


def metric_tables(rows: Sequence[ResultRow]) -> list[tuple[Table, list[str]]]:
    """One table per (suite, metric), rows per env and np (per-CPU details left out),
    each with the notes on rows whose mean's interval should not be trusted."""
    noise = noise_by_env(rows)
    groups: dict[tuple[str, str], list[ResultRow]] = {}
    for r in rows:
        if not r.detail:
            groups.setdefault((r.suite, r.metric), []).append(r)
    tables = []
    for (suite, metric), members in groups.items():
        first = members[0]
        direction = "higher" if first.higher_is_better else "lower"
        extreme = f" ({EXTREME_NOTE})" if is_extreme(suite, metric) else ""
        table = Table(
            title=Text(
                f"{suite}: {metric_title(suite, metric, first.unit)}, "
                f"{direction} is better{extreme}"
            ),
            box=box.SIMPLE_HEAD,
            header_style="bold",
            title_justify="left",
            title_style="bold",
        )
        table.add_column("env", overflow=FOLD)
        table.add_column("np", justify="right", overflow=FOLD)
        table.add_column("n", justify="right", overflow=FOLD)
        table.add_column("mean ± half-width [interval]", overflow=FOLD)
        table.add_column("overhead [interval]", overflow=FOLD)
        table.add_column("sig", overflow=FOLD)
        table.add_column("robust overhead [interval]", overflow=FOLD)
        table.add_column("irq/s", justify="right", overflow=FOLD)
        table.add_column("noise", overflow=FOLD)
        facts = any(r.facts for r in members)
        if facts:
            table.add_column("the runs say", overflow=FOLD)
        for r in members:
            cells = [
                r.env,
                "-" if r.np is None else str(r.np),
                _n_cell(r),
                _mean_cell(r),
                _overhead_cell(r),
                SIGNIFICANT if r.significant else "",
                _robust_cell(r),
                _num(r.interrupts_per_s, 3),
                _noise(noise.get(r.env)),
            ]
            if facts:
                cells.append(", ".join(f"{k} {v}" for k, v in r.facts.items()))
            table.add_row(*cells)
        tables.append((table, trust_notes(members)))
    return tables


FAILED_ALL = "failed (incl. warm-up)"


def failure_table(failures: Sequence[CellFailures]) -> Table:
    """Failed samples per environment, suite and np with the most frequent reason."""
    table = Table(
        title="failed samples",
        box=box.SIMPLE_HEAD,
        header_style="bold",
        title_justify="left",
        title_style="bold red",
    )
    # warm-ups count here (a failing warm-up tells as much as a failing repetition);
    # the metric tables' "+N failed" and results' JSON count measured repetitions only
    for col in ("env", "suite", "np", FAILED_ALL, "valid", "most frequent reason"):
        justify: JustifyMethod = "right" if col in ("np", FAILED_ALL, "valid") else "left"
        table.add_column(col, justify=justify, overflow=FOLD)
    for f in failures:
        reason = f.reason if f.reason_count == f.failed else f"{f.reason} ({f.reason_count}x)"
        if f.given_up:
            reason += " [not repeated: warm-up and rep 1 failed the same way]"
        table.add_row(
            f.env,
            f.suite,
            "-" if f.np is None else str(f.np),
            f"{f.failed} of {f.samples}",
            str(f.valid),
            Text(reason),
        )
    return table


def print_report(
    console: Console,
    run: RunRecord,
    envs: Sequence[EnvironmentRecord],
    rows: Sequence[ResultRow],
    failures: Sequence[CellFailures] = (),
) -> None:
    """The TCG warning, conditions, the tables, then the TCG warning again with the run's
    own warnings, each of those once, after the tables where the reader ends up. Into a
    file or pipe the tables are printed 160 columns wide rather than wrapped into
    unreadable cells."""
    if not console.is_terminal and console.width < WIDE:
        console = Console(file=console.file, width=WIDE, highlight=False, emoji=False)
    console.print(warnings_block(run, envs, run_warnings=False))
    console.print(conditions(run, envs, rows, failures))
    for table, notes in metric_tables(rows):
        console.print(table)
        for note in notes:
            console.print(Text(note, style="yellow"))
    if failures:
        console.print(failure_table(failures))
    console.print(
        f"{SIGNIFICANT} significant: the overhead's {run.confidence:g} interval excludes 0; "
        f"overhead > 0 means the VM is worse; irq/s is the guest's own rate for a VM; "
        f"{TOO_NOISY}: the interval reaches below zero, do not trust it; robust overhead: "
        f"Hodges-Lehmann (median of run ratios) with a distribution-free interval; "
        f"{DISTRUST}: see the note under the table; outl.: runs flagged as outliers (kept)",
        highlight=False,
    )
    console.print(warnings_block(run, envs))
