"""Text forms of the report's numbers, shared by the HTML, Markdown and terminal outputs
so a figure reads the same everywhere (pure)."""

from __future__ import annotations

import datetime as dt
import math

from hpcvm.bench.envs.placement import CONFINEMENT_TEXT
from hpcvm.model import Frozen
from hpcvm.report.compare import CompareRow
from hpcvm.report.labels import label
from hpcvm.report.model import NATIVE, FailedSamples, ReportData, Row
from hpcvm.units import format_cpu_list

STOP_REASONS = {
    "target": "every metric's interval reached the target width (--reps auto)",
    "max-reps": "the repetition cap was reached before the target width (--reps auto)",
    "max-time": "the time cap (--max-time) was reached before the target width",
    "fixed": "the fixed number of repetitions asked (--reps N) was done",
}

TABLE_HEADER = (
    "benchmark",
    "metric",
    "np",
    "env",
    "n",
    "mean [interval]",
    "unit",
    "overhead % [interval]",
    "significant",
    "robust overhead % [interval]",
    "failed",
    "the runs say",
)


def num(x: float | None) -> str:
    """4 significant digits; plain for ordinary magnitudes, exponent otherwise."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def mean_text(r: Row) -> str:
    if r.mean is None:
        why = f": {r.failure_reason}" if r.failure_reason else ""
        return f"FAILED, no value ({r.failed} failed{why})"
    if r.ci_low is None or r.ci_high is None:
        return f"{num(r.mean)} (n=1: no interval)"
    noisy = " (too noisy to trust: the interval reaches below zero)" if r.interval_note else ""
    return f"{num(r.mean)} [{num(r.ci_low)}, {num(r.ci_high)}]{noisy}"


FAILURE_HEADER = (
    "env",
    "suite",
    "np",
    "failed (incl. warm-up)",
    "valid",
    "most frequent reason",
    "logs",
)


def failure_cells(f: FailedSamples, log_separator: str) -> tuple[str, ...]:
    """One row of the failed-samples table (HTML and Markdown build theirs from it)."""
    reason = f.reason if f.reason_count == f.count else f"{f.reason} ({f.reason_count}x)"
    if f.given_up:
        reason += " [not repeated: warm-up and first repetition failed the same way]"
    return (
        f.env,
        f.suite,
        np_text(f.np),
        f"{f.count} of {f.samples}",
        str(f.valid),
        reason,
        log_separator.join(f.log_paths),
    )


def pct(x: float) -> str:
    return f"{x:+.3g}" if abs(x) < 1000 else f"{x:+.0f}"


def overhead_text(r: Row) -> str:
    if r.env == NATIVE:
        return "baseline"
    if r.overhead_pct is None:
        return f"- ({r.overhead_note})" if r.overhead_note else "-"
    distrust = f" (not to be trusted: {r.trust_note.split(': ', 1)[-1]})" if r.trust_note else ""
    if r.overhead_ci_low is None or r.overhead_ci_high is None:
        return f"{pct(r.overhead_pct)}% [unbounded]{distrust}"
    interval = f"[{pct(r.overhead_ci_low)}, {pct(r.overhead_ci_high)}]"
    return f"{pct(r.overhead_pct)}% {interval}{distrust}"


def robust_text(r: Row) -> str:
    """The Hodges-Lehmann overhead beside the mean's (and the outliers that motivate it)."""
    if r.env == NATIVE:
        return f"baseline ({r.outliers} outliers)" if r.outliers else "baseline"
    if r.robust_pct is None:
        return "-"
    outl = f"; {r.outliers} outliers" if r.outliers else ""
    if r.robust_ci_low is None or r.robust_ci_high is None:
        return f"{pct(r.robust_pct)}% [no interval]{outl}"
    return f"{pct(r.robust_pct)}% [{pct(r.robust_ci_low)}, {pct(r.robust_ci_high)}]{outl}"


def significant_text(r: Row) -> str:
    if r.significant is None:
        return "-"
    return "yes" if r.significant else "no"


def np_text(np: int | None) -> str:
    return "-" if np is None else str(np)


def row_cells(r: Row) -> tuple[str, ...]:
    """The cells of one row of the results table, in TABLE_HEADER's order."""
    return (
        label(r.suite, r.metric, r.np),
        r.metric,
        np_text(r.np),
        r.env,
        str(r.n),
        mean_text(r),
        r.unit or "-",
        overhead_text(r),
        significant_text(r),
        robust_text(r),
        str(r.failed),
        "; ".join(f"{k} {v}" for k, v in r.facts.items()) or "-",
    )


def stop_text(reason: str | None) -> str:
    if reason is None:
        return "not recorded (the run did not end normally)"
    return f"{reason}: {STOP_REASONS.get(reason, 'as recorded by hpcvm bench')}"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def method_lines(data: ReportData) -> list[str]:
    """The method in sentences: what the intervals are and how many runs stand behind them."""
    run = data.run
    level = f"{run.confidence * 100:g}%"
    reps = ", ".join(f"{env}: {n}" for env, n in run.repetitions.items()) or "none"
    return [
        f"Intervals: {level} Student-t interval of the mean; overhead is a ratio of means "
        f"(VM/native for lower-is-better metrics, native/VM otherwise) with a {level} "
        "Fieller interval (Welch degrees of freedom); significant when it excludes zero.",
        f"Repetitions measured per environment: {reps}; warm-up runs discarded: "
        f"{run.warmup_discarded}.",
        f"What stopped the repetitions: {stop_text(run.stop_reason)}.",
        "Environments ran one at a time, interleaved in a fresh random order in every "
        f"repetition block (seed {run.seed}).",
        f"Run {run.id}: {run.status}; started {when(run.started_at)}, finished "
        f"{when(run.finished_at)}, measuring time {duration(run.elapsed_s)}; "
        f"hpcvm {run.hpcvm_version}.",
        "Robust overhead: Hodges-Lehmann (the median of the VM/native run ratios) with a "
        "distribution-free interval, beside the mean's; outlying runs are kept, flagged "
        "and counted.",
        *_conditions(run.args),
    ]


def _conditions(args: dict[str, object]) -> list[str]:
    """Where native ran and how the host was tuned, as recorded when the run started."""
    lines = []
    native = args.get("native")
    if isinstance(native, dict):
        cpus, mems = native.get("cpus"), native.get("mems")
        where = (
            f"PUs {format_cpu_list(cpus)}, memory nodes {format_cpu_list(mems or [])}"
            if isinstance(cpus, list) and cpus
            else "every PU the process could use"
        )
        how = CONFINEMENT_TEXT.get(str(native.get("confine", "cpuset")), "cgroup cpuset")
        held = f" by {how}" if isinstance(cpus, list) and cpus else ""
        lines.append(f"Native runs were confined to {where}{held} ({native.get('source', '')}).")
    tuning = args.get("tuning")
    if isinstance(tuning, dict):
        lines.append(f"Host tuning when the run started: {tuning_text(args)}.")
    return lines


def tuning_text(args: dict[str, object]) -> str:
    """The host's tuning as recorded when the run started: whether ``hpcvm tune`` was
    applied, then every setting's state (a comparison of an untuned with a tuned run
    shows each side's, so the change it reports can be read as the tuning's)."""
    tuning = args.get("tuning")
    if not isinstance(tuning, dict):
        return "not recorded"
    settings = "; ".join(f"{k} {v}" for k, v in tuning.items() if k != "hpcvm_tune")
    return f"hpcvm tune {tuning.get('hpcvm_tune', '?')}; {settings}"


def change_text(r: CompareRow) -> str:
    if r.change_pct is None:
        return "-"
    if r.change_ci_low is None or r.change_ci_high is None:
        return f"{pct(r.change_pct)}% [unbounded]"
    return f"{pct(r.change_pct)}% [{pct(r.change_ci_low)}, {pct(r.change_ci_high)}]"


def compare_significance(r: CompareRow) -> str:
    if not r.significant or r.change_pct is None:
        return "no"
    return "yes: B worse" if r.change_pct > 0 else "yes: B better"


class EvidenceTable(Frozen):
    """One table of the report's evidence section, built once for every format."""

    title: str
    intro: str  # a sentence before the table ("" for none)
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: frozenset[int] = frozenset()  # columns to align as numbers


DRIFT_INTRO = (
    "Drift of the guest clock over each sample (change of the guest-minus-host offset "
    "between two reads through the agent). Too short: the reads' round trips are too long "
    "for the sample to show a drift of the limit, so its drift figure is no evidence "
    "either way."
)


def evidence_tables(data: ReportData, log_separator: str) -> list[EvidenceTable]:
    """Interrupts, guest clock and failed samples, as rows; HTML and Markdown only lay
    them out, so the two can never disagree."""
    tables: list[EvidenceTable] = []
    if data.interrupts:
        tables.append(
            EvidenceTable(
                title="Interrupts per second",
                intro="",
                header=("env", "suite", "np", "side", "samples", "total/s", "top sources/s"),
                rows=tuple(
                    (
                        i.env,
                        i.suite,
                        np_text(i.np),
                        i.side,
                        str(i.samples),
                        num(i.total_per_s),
                        ", ".join(f"{s} {num(v)}" for s, v in i.top_sources),
                    )
                    for i in data.interrupts
                ),
                numeric=frozenset({4, 5}),
            )
        )
    if data.drift:
        tables.append(
            EvidenceTable(
                title="Guest clock against host time",
                intro=DRIFT_INTRO,
                header=(
                    "env",
                    "samples",
                    "beyond limit",
                    "too short",
                    "clock unreadable",
                    "largest drift",
                    "limit",
                ),
                rows=tuple(
                    (
                        d.env,
                        str(d.samples),
                        str(d.flagged),
                        str(d.unresolved),
                        str(d.missing),
                        f"{d.worst_pct:+.4f}%",
                        f"{d.limit_pct:g}%",
                    )
                    for d in data.drift
                ),
            )
        )
    if data.failures:
        tables.append(
            EvidenceTable(
                title="Failed samples",
                intro="",
                header=FAILURE_HEADER,
                rows=tuple(failure_cells(f, log_separator) for f in data.failures),
                numeric=frozenset({3, 4}),
            )
        )
    return tables
