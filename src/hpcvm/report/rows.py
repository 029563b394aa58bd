"""Summary rows (env x suite x np x metric) from a run's samples, with hpcvm.stats (pure).

Each row is the mean of the non-warm-up values with its Student-t interval at the run's
confidence, and, for a VM, its overhead against native on the same suite, np and metric
(ratio of means, Fieller interval). Failed samples are counted, not summarised.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from hpcvm.report.model import NATIVE, Row
from hpcvm.stats import overhead, summarize
from hpcvm.store import EnvironmentRecord, SampleRecord

Key = tuple[str, str, int | None]  # env, suite, np
MetricKey = tuple[str, int | None, str]  # suite, np, metric


def tcg_warning(env: str) -> str:
    return (
        f"{env} ran under TCG (software emulation): its overhead shows emulation, "
        "not hardware virtualization"
    )


def _collect(
    samples: Sequence[SampleRecord],
) -> tuple[dict[Key, dict[str, list[float]]], dict[str, tuple[str, bool]], dict[Key, int]]:
    values: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    meta: dict[str, tuple[str, bool]] = {}
    failed: dict[Key, int] = defaultdict(int)
    for s in samples:
        if s.warmup:
            continue
        key = (s.env, s.suite, s.np)
        if not s.ok:
            failed[key] += 1
            continue
        for m in s.metrics:
            meta.setdefault(m.metric, (m.unit, m.higher_is_better))
            if m.value is not None:
                values[key][m.metric].append(m.value)
    return values, meta, failed


def _row(
    env: EnvironmentRecord,
    key: MetricKey,
    vals: list[float],
    native: list[float] | None,
    meta: tuple[str, bool],
    confidence: float,
    stop_reason: str | None,
    failed: int,
) -> Row:
    suite, np_, metric = key
    unit, higher = meta
    s = summarize(vals, confidence)
    warnings = [tcg_warning(env.name)] if env.accel == "tcg" else []
    fields: dict[str, object] = {}
    if env.name != NATIVE and native:
        o = overhead(native, vals, higher_is_better=higher, confidence=confidence)
        fields = {
            "overhead_pct": o.overhead_pct,
            "overhead_ci_low": o.overhead_ci_low,
            "overhead_ci_high": o.overhead_ci_high,
            "significant": o.significant,
            "overhead_note": o.note,
        }
    return Row.model_validate(
        {
            "env": env.name,
            "suite": suite,
            "metric": metric,
            "unit": unit,
            "higher_is_better": higher,
            "np": np_,
            "n": s.n,
            "mean": s.mean,
            "ci_low": s.ci_low,
            "ci_high": s.ci_high,
            "accel": env.accel,
            "cpu_model": env.cpu_model,
            "stop_reason": stop_reason,
            "warnings": tuple(warnings),
            "failed": failed,
            "values": tuple(vals),
            **fields,
        }
    )


def summary_rows(
    envs: Sequence[EnvironmentRecord],
    samples: Sequence[SampleRecord],
    confidence: float,
    stop_reason: str | None = None,
) -> list[Row]:
    """One row per env x suite x np x metric that has at least one value, in the order
    suites, np and metrics were first measured, environments in run order."""
    values, meta, failed = _collect(samples)
    order: dict[MetricKey, None] = {}
    for s in samples:
        for m in s.metrics:
            order.setdefault((s.suite, s.np, m.metric), None)
    rows = []
    for key in _stable_group(list(order)):
        suite, np_, metric = key
        native = values.get((NATIVE, suite, np_), {}).get(metric)
        for env in envs:
            vals = values.get((env.name, suite, np_), {}).get(metric)
            if vals:
                rows.append(
                    _row(
                        env,
                        key,
                        vals,
                        native,
                        meta[metric],
                        confidence,
                        stop_reason,
                        failed.get((env.name, suite, np_), 0),
                    )
                )
    return rows


def _stable_group(keys: list[MetricKey]) -> list[MetricKey]:
    """Group by suite (first-seen order), then np ascending, then metric first-seen."""
    suites = list(dict.fromkeys(k[0] for k in keys))
    position = {k: i for i, k in enumerate(keys)}
    return sorted(
        keys,
        key=lambda k: (suites.index(k[0]), -1 if k[1] is None else k[1], position[k]),
    )
