"""Summaries of a run, recomputed from its database with hpcvm.stats.

One ``ResultRow`` per environment x suite x np x metric: the mean of the non-warm-up
values with its Student-t interval at the run's confidence, and for a VM its overhead
against native on the same suite, np and metric (ratio of means; Fieller interval by
default, BCa bootstrap on request). The overhead fields are ``None`` for native itself,
where there is no native value to compare with, and where no finite interval exists
(fewer than 2 values on a side, or Fieller's set unbounded): ``overhead_note`` then says
why, and ``significant`` is False, because nothing can be claimed. A metric that failed
in every sample of an environment still gets a row (``n`` 0, ``mean`` None), so a
reader sees what is missing instead of a shorter table (failed samples record the
headline metrics they failed to measure, with the reason). A metric an environment did
not measure at all (noise's per-CPU figure for a CPU it does not have) has no row.

Every row carries the conditions: accelerator, CPU model, which rule stopped the run,
and its warnings (TCG emulation, failed samples, clock drift, the run's own warnings).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from hpcvm.errors import BenchmarkError
from hpcvm.model import Frozen
from hpcvm.stats import (
    flag_outliers,
    outlier_count,
    overhead,
    overhead_trust,
    robust_overhead,
    summarize,
)
from hpcvm.stats.overhead import Method
from hpcvm.store import EnvironmentRecord, RunRecord, SampleRecord, Store

NATIVE = "native"
TCG_ROW_WARNING = (
    "TCG: measured under software emulation; the overhead shows emulation, not hardware "
    "virtualization"
)

Cell = tuple[str, str, int | None]  # env, suite, np


class ResultRow(Frozen):
    """Summary of one metric in one environment, suite and process count."""

    run_id: int
    env: str
    suite: str
    metric: str
    unit: str
    higher_is_better: bool
    np: int | None  # None when the suite ignores the process count (noise)
    detail: bool  # a per-CPU detail metric (``...@cpu1``), not a headline figure
    n: int  # values summarised (ok samples with this metric)
    failed: int  # samples of this cell that failed, or that lack this metric
    failed_samples: int = 0  # samples of this cell that failed outright
    failure_reason: str | None = None  # the most frequent reason, with its share
    facts: dict[str, str] = Field(default_factory=dict)  # what the runs said of themselves
    mean: float | None
    stdev: float | None
    ci_low: float | None
    ci_high: float | None
    half_width: float | None
    interval_note: str = ""  # why the interval should not be read as meaning something
    confidence: float
    overhead_pct: float | None = None
    overhead_ci_low: float | None = None
    overhead_ci_high: float | None = None
    significant: bool | None = None  # None for native
    overhead_method: str | None = None
    overhead_note: str = ""
    outliers: int = 0  # values of this row flagged as outlying (kept, counted here)
    robust_pct: float | None = None  # Hodges-Lehmann overhead (median pairwise ratio)
    robust_ci_low: float | None = None
    robust_ci_high: float | None = None
    robust_significant: bool | None = None
    robust_note: str = ""
    trust_kinds: tuple[str, ...] = ()  # why the mean's interval should not be trusted
    trust_note: str = ""  # the same as one sentence ("" when nothing was found)
    interrupts_per_s: float | None = None  # mean total rate: in the guest for a VM
    host_interrupts_per_s: float | None = None  # mean total rate on the host
    drift_flagged: int = 0  # samples whose guest clock drifted beyond the limit
    drift_unresolved: int = 0  # samples too short to resolve the limit
    accel: str = ""
    cpu_model: str = ""
    stop_reason: str | None = None
    warnings: tuple[str, ...] = ()


def summaries(
    store: Store, run_id: int | None = None, *, method: Method = "fieller"
) -> list[ResultRow]:
    """Rows of run ``run_id`` (default: the latest) of an open store."""
    run = store.run(run_id)
    return summarize_run(run, store.environments(run.id), store.samples(run.id), method=method)


def summarize_run(
    run: RunRecord,
    envs: Sequence[EnvironmentRecord],
    samples: Sequence[SampleRecord],
    *,
    method: Method = "fieller",
) -> list[ResultRow]:
    """Rows from store records (pure: no I/O)."""
    measured = [s for s in samples if not s.warmup]
    values, meta, order = _collect(measured)
    by_cell: dict[Cell, list[SampleRecord]] = defaultdict(list)
    for s in measured:
        by_cell[(s.env, s.suite, s.np)].append(s)
    env_by_name = {e.name: e for e in envs}
    seen = {((s.env, s.suite, s.np), m.metric) for s in measured for m in s.metrics}
    rows: list[ResultRow] = []
    for suite, np_, metric in order:
        for env in envs:
            cell = (env.name, suite, np_)
            if cell not in by_cell or (cell, metric) not in seen:
                continue  # a metric this environment did not measure has no row
            rows.append(
                _row(
                    run, env_by_name[env.name], cell, metric, meta[metric], values, by_cell, method
                )
            )
    return rows


def _collect(
    measured: Sequence[SampleRecord],
) -> tuple[
    dict[Cell, dict[str, list[float]]],
    dict[str, tuple[str, bool]],
    list[tuple[str, int | None, str]],
]:
    """Values per cell and metric, each metric's unit and direction, and the order in
    which (suite, np, metric) first appeared."""
    values: dict[Cell, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    meta: dict[str, tuple[str, bool]] = {}
    order: dict[tuple[str, int | None, str], None] = {}
    for s in measured:
        for m in s.metrics:
            meta.setdefault(m.metric, (m.unit, m.higher_is_better))
            order.setdefault((s.suite, s.np, m.metric), None)
            if s.ok and m.value is not None:
                values[(s.env, s.suite, s.np)][m.metric].append(m.value)
    ordered = sorted(order, key=lambda k: (_first(order, k[0]), k[1] or 0))
    return values, meta, ordered


def _first(order: dict[tuple[str, int | None, str], None], suite: str) -> int:
    return next(i for i, k in enumerate(order) if k[0] == suite)


def _mean(items: Sequence[float]) -> float | None:
    return sum(items) / len(items) if items else None


def _row(
    run: RunRecord,
    env: EnvironmentRecord,
    cell: Cell,
    metric: str,
    meta: tuple[str, bool],
    values: dict[Cell, dict[str, list[float]]],
    by_cell: dict[Cell, list[SampleRecord]],
    method: Method,
) -> ResultRow:
    env_name, suite, np_ = cell
    unit, higher = meta
    vals = values.get(cell, {}).get(metric, [])
    samples = by_cell[cell]
    ok = [s for s in samples if s.ok]
    fields: dict[str, Any] = {
        "run_id": run.id,
        "env": env_name,
        "suite": suite,
        "metric": metric,
        "unit": unit,
        "higher_is_better": higher,
        "np": np_,
        "detail": "@" in metric,
        "n": len(vals),
        "failed": len(samples) - len(vals),
        "confidence": run.confidence,
        "accel": env.accel,
        "cpu_model": env.cpu_model,
        "stop_reason": run.stop_reason,
        "interrupts_per_s": _mean(_totals(ok, "guest" if env.kind == "vm" else "host")),
        "host_interrupts_per_s": _mean(_totals(ok, "host")),
        "drift_flagged": sum(1 for s in ok if _clock(s).get("flagged") is True),
        "drift_unresolved": sum(1 for s in ok if _clock(s).get("resolved") is False),
    }
    fields |= _summary_fields(vals, run.confidence)
    fields["outliers"] = outlier_count(vals) if vals else 0
    fields |= _failure_fields(samples, metric)
    fields["facts"] = _facts(samples)
    if fields["ci_low"] is not None and fields["ci_low"] < 0 < min(vals):
        # Only when every sample is positive: a --cmd metric may be negative by nature,
        # and then an interval across zero is what its samples say, not noise.
        fields["interval_note"] = (
            "too noisy to trust: every sample is positive but the interval reaches below "
            "zero; measure more repetitions or a larger problem"
        )
    native_vals = values.get((NATIVE, suite, np_), {}).get(metric, [])
    if env_name != NATIVE:
        fields |= _overhead_fields(
            native_vals, vals, higher, run.confidence, method, cell, env_name
        )
    fields["warnings"] = tuple(_warnings(run, env, fields))
    return ResultRow.model_validate(fields)


def _facts(samples: Sequence[SampleRecord]) -> dict[str, str]:
    """Each fact the cell's runs reported, with how often each value came: NPB's
    ``verification: SUCCESSFUL 5/6, UNSUCCESSFUL 1/6``; one value stands alone."""
    seen: dict[str, Counter[str]] = defaultdict(Counter)
    for s in samples:
        facts = s.evidence.get("facts")
        if isinstance(facts, dict):
            for key, value in facts.items():
                seen[str(key)][str(value)] += 1
    out: dict[str, str] = {}
    for key, counts in seen.items():
        total = sum(counts.values())
        if len(counts) == 1 and key != "verification":
            out[key] = next(iter(counts))
        else:
            out[key] = ", ".join(f"{v} {n}/{total}" for v, n in counts.most_common())
    return out


def outlier_marks(samples: Sequence[SampleRecord]) -> list[tuple[int, str]]:
    """(sample id, metric) of every measured value flagged as outlying among the values
    of its environment, suite, np and metric (stats.flag_outliers; kept, only marked)."""
    series: dict[tuple[str, str, int | None, str], list[tuple[int, float]]] = defaultdict(list)
    for s in samples:
        if s.warmup or not s.ok:
            continue
        for m in s.metrics:
            if m.value is not None:
                series[(s.env, s.suite, s.np, m.metric)].append((s.id, m.value))
    marks = []
    for (_, _, _, metric), items in series.items():
        flags = flag_outliers([v for _, v in items])
        marks += [
            (sample_id, metric) for (sample_id, _), flag in zip(items, flags, strict=True) if flag
        ]
    return marks


def _failure_fields(samples: Sequence[SampleRecord], metric: str) -> dict[str, Any]:
    """How many samples of the cell failed outright and their most frequent reason (a
    metric missing from an otherwise good sample counts in ``failed`` only)."""
    reasons: list[str] = []
    for s in samples:
        if not s.ok:
            reasons.append(s.error or "no reason recorded")
            continue
        missing = next((m for m in s.metrics if m.metric == metric and m.value is None), None)
        if missing is not None:
            reasons.append(missing.error or "no value")
    if not reasons:
        return {"failed_samples": 0, "failure_reason": None}
    reason, count = Counter(reasons).most_common(1)[0]
    share = "" if count == len(reasons) else f" ({count} of {len(reasons)})"
    return {"failed_samples": sum(1 for s in samples if not s.ok), "failure_reason": reason + share}


def _totals(samples: Sequence[SampleRecord], side: str) -> list[float]:
    """Total interrupt rates of one side (host or guest) over the samples that have it."""
    out = []
    for sample in samples:
        totals = sample.evidence.get("interrupts_total", {})
        value = totals.get(side) if isinstance(totals, dict) else None
        if isinstance(value, int | float):
            out.append(float(value))
    return out


def _clock(sample: SampleRecord) -> dict[str, Any]:
    found = sample.evidence.get("clock")
    return found if isinstance(found, dict) else {}


def _summary_fields(vals: list[float], confidence: float) -> dict[str, Any]:
    if not vals:
        return {"mean": None, "stdev": None, "ci_low": None, "ci_high": None, "half_width": None}
    s = summarize(vals, confidence)
    return {
        "mean": s.mean,
        "stdev": s.stdev,
        "ci_low": s.ci_low,
        "ci_high": s.ci_high,
        "half_width": s.half_width,
    }


def _overhead_fields(
    native: list[float],
    vm: list[float],
    higher: bool,
    confidence: float,
    method: Method,
    cell: Cell,
    env_name: str,
) -> dict[str, Any]:
    base: dict[str, Any] = {"significant": False, "overhead_method": method}
    if not native:
        return base | {"overhead_note": "no native value to compare with"}
    if not vm:
        return base | {"overhead_note": "no value in this environment"}
    base |= _robust_fields(native, vm, higher, confidence)
    try:
        o = overhead(native, vm, higher_is_better=higher, confidence=confidence, method=method)
    except BenchmarkError as exc:
        return base | {"overhead_note": exc.message}
    trust = overhead_trust(native, vm, o, subject=env_name)
    base |= {"trust_kinds": trust.kinds, "trust_note": trust.sentence}
    if not o.bounded:
        return base | {"overhead_note": o.note}
    return base | {
        "overhead_pct": o.overhead_pct,
        "overhead_ci_low": o.overhead_ci_low,
        "overhead_ci_high": o.overhead_ci_high,
        "significant": o.significant,
        "overhead_note": o.note,
    }


def _robust_fields(
    native: list[float], vm: list[float], higher: bool, confidence: float
) -> dict[str, Any]:
    """The distribution-free overhead beside the mean's (METHOD.md, "Outliers"): it
    keeps its coverage when rare slow runs break the mean's interval."""
    try:
        r = robust_overhead(native, vm, higher_is_better=higher, confidence=confidence)
    except BenchmarkError as exc:
        return {"robust_note": exc.message}
    if not r.bounded:
        return {"robust_pct": r.overhead_pct, "robust_note": r.note}
    return {
        "robust_pct": r.overhead_pct,
        "robust_ci_low": r.overhead_ci_low,
        "robust_ci_high": r.overhead_ci_high,
        "robust_significant": r.significant,
        "robust_note": r.note,
    }


def _warnings(run: RunRecord, env: EnvironmentRecord, fields: dict[str, Any]) -> list[str]:
    """The run's general warnings and this environment's own (the store records which
    environment a warning is about), then this row's."""
    out = [w for w in run.warnings if run.warning_envs.get(w, env.name) == env.name]
    if env.accel == "tcg":
        out.insert(0, TCG_ROW_WARNING)
    if fields["failed"]:
        out.append(
            f"{fields['failed']} sample(s) failed or lack this metric: "
            f"{fields['failure_reason']}; see their logs"
        )
    if fields.get("interval_note"):
        out.append(fields["interval_note"])
    if fields.get("trust_note"):
        out.append(fields["trust_note"])
    if fields["drift_flagged"]:
        out.append(
            f"guest clock drift beyond 0.1% in {fields['drift_flagged']} sample(s): "
            "guest-timed figures are suspect"
        )
    if run.status != "finished":
        out.append(f"run {run.id} is {run.status_text}: these are the samples finished so far")
    return out


def noise_by_env(rows: Sequence[ResultRow]) -> dict[str, dict[str, float | None]]:
    """Per environment, the noise suite's headline figures (for tables)."""
    out: dict[str, dict[str, float | None]] = {}
    for r in rows:
        if r.suite == "noise" and not r.detail:
            out.setdefault(r.env, {})[r.metric] = r.mean
    return out
