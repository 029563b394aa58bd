"""Read one run of a results database into a ReportData (the report's only reader).

Everything the outputs show comes from here: the store's runs, environments and samples
(``hpcvm.store`` read API); the summary rows of ``hpcvm results`` (bench/results/results.py,
computed with ``hpcvm.stats``); and the evidence each sample kept (bench/envs/evidence.py):
interrupts per second per source (``evidence["interrupts"][host|guest]``), the guest
clock check (``evidence["clock"]``), failed samples with their logs, and the noise
suite's raw per-quantum durations. The store does not hold those durations: they are
read from the ``noise-raw.txt`` each noise sample left in its kept work directory (a VM
run copies it back to the host), so a report of moved or pruned results draws no
detour distribution and says why. The same raw durations feed ``report --scale``'s
prediction at scale (report/scale.py), when it is asked for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcvm.bench.core.metrics import ParseError
from hpcvm.bench.results.failures import NO_REASON, cell_failures
from hpcvm.bench.suites.noise.suite import RAW_FILE, read_raw
from hpcvm.report.describe import host_summary, plan_summary
from hpcvm.report.detours import detour_curve
from hpcvm.report.labels import env_order
from hpcvm.report.model import (
    DriftInfo,
    EnvInfo,
    FailedSamples,
    InterruptRate,
    NoiseCurve,
    ReportData,
    ReportWarning,
    RunInfo,
)
from hpcvm.report.rows import summary_rows, tcg_warning
from hpcvm.report.scale import ScaleRequest, scale_report
from hpcvm.stats import DRIFT_LIMIT
from hpcvm.store import EnvironmentRecord, RunRecord, SampleRecord, Store

NOISE_SUITE = "noise"
TOP_SOURCES = 3


def load_report(
    results: Path, run_id: int | None = None, scale: ScaleRequest | None = None
) -> ReportData:
    """The report of run ``run_id`` (default: the latest) of the database in ``results``
    (a results directory or its ``hpcvm.db``), with the prediction at scale when
    ``scale`` asks for one. BenchmarkError when there is none."""
    with Store.open(results) as store:
        run = store.run(run_id)
        envs = store.environments(run.id)
        samples = store.samples(run.id)
        directory = store.path.parent
    return build_report(run, envs, samples, directory, scale)


def build_report(
    run: RunRecord,
    envs: Sequence[EnvironmentRecord],
    samples: Sequence[SampleRecord],
    results_dir: Path,
    scale: ScaleRequest | None = None,
) -> ReportData:
    """Assemble the report model from store records (reads only noise raw files)."""
    measured = [s for s in samples if not s.warmup]
    noise_runs, notes = _noise_runs(envs, measured)
    rows = tuple(summary_rows(run, envs, samples))
    scale_part = None
    if scale is not None:
        traces = noise_runs if scale.noise_from is None else _noise_elsewhere(scale.noise_from)
        scale_part = scale_report(traces, rows, scale, run.confidence)
    drift = _drift(envs, measured)
    failures = _failures(samples)
    data = ReportData(
        run=_run_info(run, measured, samples, results_dir),
        host=host_summary(run.host),
        envs=tuple(_env_info(e) for e in envs),
        rows=rows,
        interrupts=tuple(_interrupts(measured)),
        drift=tuple(drift),
        failures=tuple(failures),
        noise=tuple(_noise_curves(noise_runs)),
        notes=tuple(notes),
        scale=scale_part,
    )
    return data.model_copy(update={"warnings": tuple(_warnings(run, envs, drift, failures))})


def _run_info(
    run: RunRecord,
    measured: Sequence[SampleRecord],
    samples: Sequence[SampleRecord],
    results_dir: Path,
) -> RunInfo:
    reps: dict[str, set[int]] = defaultdict(set)
    for s in measured:
        reps[s.env].add(s.repetition)
    return RunInfo(
        id=run.id,
        results_dir=str(results_dir),
        status=run.status_text,
        stop_reason=run.stop_reason,
        confidence=run.confidence,
        started_at=run.started_at,
        finished_at=run.finished_at,
        elapsed_s=run.elapsed_s,
        seed=run.seed,
        hpcvm_version=run.hpcvm_version,
        args=run.args,
        repetitions={env: len(reps[env]) for env in env_order(reps)},
        warmup_discarded=sum(1 for s in samples if s.warmup),
    )


def _env_info(e: EnvironmentRecord) -> EnvInfo:
    return EnvInfo(
        name=e.name,
        kind=e.kind,
        profile=e.profile,
        accel=e.accel,
        cpu_model=e.cpu_model,
        versions=e.versions,
        vcpus=e.vcpus,
        memory_bytes=e.memory_bytes,
        plan=plan_summary(e.plan),
        variant=e.variant,
    )


def _rates(evidence: dict[str, Any]) -> dict[str, dict[str, float]]:
    """side -> source -> interrupts/s, skipping anything that is not a number."""
    found = evidence.get("interrupts")
    if not isinstance(found, dict):
        return {}
    out: dict[str, dict[str, float]] = {}
    for side, sources in found.items():
        if isinstance(sources, dict):
            out[str(side)] = {
                str(k): float(v) for k, v in sources.items() if isinstance(v, int | float)
            }
    return out


def _interrupts(measured: Sequence[SampleRecord]) -> list[InterruptRate]:
    per: dict[tuple[str, str, int | None, str], list[dict[str, float]]] = defaultdict(list)
    for s in measured:
        if s.ok:
            for side, sources in _rates(s.evidence).items():
                per[(s.env, s.suite, s.np, side)].append(sources)
    out = []
    for (env, suite, np_, side), runs in per.items():
        means: dict[str, float] = defaultdict(float)
        for sources in runs:
            for name, rate in sources.items():
                means[name] += rate / len(runs)
        top = sorted(means.items(), key=lambda kv: -kv[1])[:TOP_SOURCES]
        out.append(
            InterruptRate(
                env=env,
                suite=suite,
                np=np_,
                side=side,
                samples=len(runs),
                total_per_s=sum(means.values()),
                top_sources=tuple(top),
            )
        )
    return out


def _clock(sample: SampleRecord) -> dict[str, Any] | None:
    found = sample.evidence.get("clock")
    return found if isinstance(found, dict) else None


def _drift(envs: Sequence[EnvironmentRecord], measured: Sequence[SampleRecord]) -> list[DriftInfo]:
    """Per VM environment, the bench's clock checks (``evidence["clock"]``)."""
    out = []
    for env in envs:
        clocks = [c for s in measured if s.env == env.name and (c := _clock(s)) is not None]
        checks = [c for c in clocks if isinstance(c.get("relative"), int | float)]
        if env.kind != "vm" or not clocks:
            continue
        worst = max((float(c["relative"]) for c in checks), key=abs, default=0.0)
        limit = next((float(c["limit"]) for c in checks if "limit" in c), DRIFT_LIMIT)
        out.append(
            DriftInfo(
                env=env.name,
                samples=len(checks),
                flagged=sum(1 for c in checks if c.get("flagged") is True),
                unresolved=sum(1 for c in checks if c.get("resolved") is False),
                worst_pct=100.0 * worst,
                limit_pct=100.0 * limit,
                missing=len(clocks) - len(checks),
            )
        )
    return out


def _failures(samples: Sequence[SampleRecord]) -> list[FailedSamples]:
    """bench/results/failures.py's counts (the table and ``results`` show the same), plus every
    distinct reason and log for the report's readers."""
    out = []
    for f in cell_failures(samples):
        bad = [s for s in samples if (s.env, s.suite, s.np) == (f.env, f.suite, f.np) and not s.ok]
        out.append(
            FailedSamples(
                env=f.env,
                suite=f.suite,
                np=f.np,
                count=f.failed,
                errors=tuple(dict.fromkeys(s.error or NO_REASON for s in bad)),
                log_paths=f.logs,
                samples=f.samples,
                valid=f.valid,
                reason=f.reason,
                reason_count=f.reason_count,
                given_up=f.given_up,
            )
        )
    return out


def _noise_runs(
    envs: Sequence[EnvironmentRecord], measured: Sequence[SampleRecord]
) -> tuple[dict[str, list[dict[int, list[int]]]], list[str]]:
    """Per environment, every readable noise sample's raw durations (CPU -> ns per
    quantum), and a note for each environment with samples whose file is gone."""
    found: dict[str, list[dict[int, list[int]]]] = {}
    notes = []
    for env in envs:
        runs, missing = [], 0
        for s in measured:
            if s.env != env.name or s.suite != NOISE_SUITE or not s.ok:
                continue
            raw = Path(s.workdir) / RAW_FILE if s.workdir else None
            try:
                if raw is None:
                    raise ParseError("no work directory recorded")
                runs.append(read_raw(raw))
            except ParseError:
                missing += 1
        if missing:
            notes.append(
                f"{env.name}: raw noise durations of {missing} noise sample(s) cannot be "
                f"read (their work directory no longer holds {RAW_FILE}, or this user may "
                "not read it); the detour distribution uses the rest"
            )
        if runs:
            found[env.name] = runs
    return found, notes


def _noise_elsewhere(results: Path) -> dict[str, list[dict[int, list[int]]]]:
    """The noise traces of the latest run in another results directory (``report
    --scale-noise``): a run across nodes cannot run the noise suite, one on a node can."""
    with Store.open(results) as store:
        run = store.run(None)
        envs = store.environments(run.id)
        samples = store.samples(run.id)
    runs, _ = _noise_runs(envs, [s for s in samples if not s.warmup])
    return runs


def _noise_curves(runs: dict[str, list[dict[int, list[int]]]]) -> list[NoiseCurve]:
    return [detour_curve(env, env_runs) for env, env_runs in runs.items()]


def _warnings(
    run: RunRecord,
    envs: Sequence[EnvironmentRecord],
    drift: Sequence[DriftInfo],
    failures: Sequence[FailedSamples],
) -> list[ReportWarning]:
    out = [
        ReportWarning(kind="tcg", text=tcg_warning(e.name), env=e.name)
        for e in envs
        if e.accel == "tcg"
    ]
    if run.status != "finished":
        out.append(
            ReportWarning(
                kind="run",
                text=f"run {run.id} is {run.status_text}: the report shows the samples "
                "finished so far",
            )
        )
    # the TCG warnings above come from the environments' accelerators; the run's own
    # warnings no longer repeat them
    out += [ReportWarning(kind="run", text=w) for w in run.warnings]
    out += [
        ReportWarning(
            kind="drift",
            env=d.env,
            text=(
                f"{d.env}: guest clock drift above {d.limit_pct:g}% in {d.flagged} of "
                f"{d.samples} samples (worst {d.worst_pct:+.3f}%): guest-timed figures "
                "are suspect"
            ),
        )
        for d in drift
        if d.flagged
    ]
    out += [
        ReportWarning(
            kind="drift",
            env=d.env,
            text=f"{d.env}: the guest clock could not be read in {d.missing} sample(s): "
            "no timekeeping check for them",
        )
        for d in drift
        if d.missing
    ]
    for f in failures:
        where = f" np={f.np}" if f.np is not None else ""
        none = "; no valid sample" if f.valid == 0 else ""
        out.append(
            ReportWarning(
                kind="failed",
                env=f.env,
                text=f"{f.count} of {f.samples} samples of {f.env} {f.suite}{where} failed"
                f"{none}: {f.reason}",
            )
        )
    return out
