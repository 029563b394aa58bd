"""``report --scale``: what each environment's measured noise would cost a
bulk-synchronous code at 1,024 cores and beyond (the model is ``hpcvm.stats.scale``;
docs/scale.md has its assumptions).

Inputs, all from the run itself: every noise sample's raw quanta (one trace per run and
CPU), the collective's per-stage latency from the netpipe suite's 1-byte latency where
the environment ran it (``--scale-latency`` overrides, a named default otherwise), and
the ``bsp`` suite's measured slowdown at the ranks the run had, to set beside the
prediction at the same scale and grain.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hpcvm.bench.suites.bsp.suite import GRAIN, SLOWDOWN, BspSuite
from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.report.labels import env_order
from hpcvm.report.model import NATIVE, Row, ScaleLatency, ScaleMeasured, ScaleReport
from hpcvm.stats.scale import (
    DEFAULT_GRAINS_NS,
    DEFAULT_RESAMPLES,
    Prediction,
    ScaleCurve,
    ScaleOverhead,
    ScaleParams,
    overhead_at_scale,
    predict,
)

DEFAULT_ASKED = (1024, 4096, 16384)
FIGURE_TOP = 16384  # the figure runs from 1 core to at least this many
# One stage of a tree collective over a modern HPC interconnect (InfiniBand, Slingshot):
# a small message's one-way latency of about 1.5 us. Used only without a netpipe run.
DEFAULT_LATENCY_NS = 1500.0
LATENCY_SUITE, LATENCY_METRIC = "netpipe", "latency_1B"
BSP_SUITE = BspSuite.name
BSP_SLOWDOWN, BSP_GRAIN = SLOWDOWN.name, GRAIN.name
MAX_CORES = 1 << 24

RawRun = Mapping[int, Sequence[int]]
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s)\s*$")
_UNIT_NS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}


@dataclass(frozen=True)
class ScaleRequest:
    """What ``report --scale`` asks: core counts for the table, grains, the latency
    override, and the bootstrap's size and seed."""

    cores: tuple[int, ...] = DEFAULT_ASKED
    grains_ns: tuple[float, ...] = tuple(float(g) for g in DEFAULT_GRAINS_NS)
    latency_ns: float | None = None
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    noise_from: Path | None = None  # another results directory's noise traces


def parse_cores(text: str) -> tuple[int, ...]:
    """``1024,4096,16384`` -> (1024, 4096, 16384); UsageError naming the bad item."""
    out = []
    for item in text.split(","):
        try:
            value = int(item.strip())
        except ValueError:
            raise UsageError(
                f"--scale: {item.strip()!r} is not a core count; give counts like 1024,4096,16384"
            ) from None
        if not 1 <= value <= MAX_CORES:
            raise UsageError(f"--scale: core counts lie between 1 and {MAX_CORES}, not {value}")
        out.append(value)
    return tuple(sorted(set(out)))


def parse_time_ns(text: str, option: str) -> float:
    """``100us``, ``1ms``, ``1.5us`` -> nanoseconds; UsageError otherwise."""
    found = _TIME.match(text)
    if found is None:
        raise UsageError(f"{option}: {text.strip()!r} is not a time; give e.g. 10us, 1ms")
    return float(found.group(1)) * _UNIT_NS[found.group(2)]


def parse_grains(text: str) -> tuple[float, ...]:
    """``10us,100us,1ms`` -> nanoseconds, each positive."""
    grains = sorted({parse_time_ns(item, "--grain") for item in text.split(",")})
    if grains[0] <= 0:
        raise UsageError("--grain: a grain of work must be longer than 0")
    return tuple(grains)


def figure_cores(asked: Iterable[int], ran: int) -> tuple[int, ...]:
    """Powers of two from 1 to at least FIGURE_TOP, plus the asked and the run's own."""
    wanted = {*asked, ran}
    top = max(FIGURE_TOP, *wanted)
    powers = {1 << k for k in range(top.bit_length()) if 1 << k <= top}
    return tuple(sorted(powers | wanted))


def _traces(runs: Sequence[RawRun]) -> list[Sequence[int]]:
    """One trace per run and CPU: each is a unit of the bootstrap."""
    return [durations for run in runs for _, durations in sorted(run.items())]


def _latency(env: str, rows: Sequence[Row], override: float | None) -> ScaleLatency:
    if override is not None:
        return ScaleLatency(env=env, latency_ns=override, source="--scale-latency")
    for r in rows:
        if (r.env, r.suite, r.metric) == (env, LATENCY_SUITE, LATENCY_METRIC) and r.mean:
            return ScaleLatency(
                env=env, latency_ns=1e3 * r.mean, source=f"{LATENCY_SUITE} {LATENCY_METRIC}"
            )
    return ScaleLatency(env=env, latency_ns=DEFAULT_LATENCY_NS, source="default")


def _measured(rows: Sequence[Row]) -> list[ScaleMeasured]:
    """The bsp suite's slowdown per environment and rank count, with its grain."""
    grains = {
        (r.env, r.np): r.mean
        for r in rows
        if r.suite == BSP_SUITE and r.metric == BSP_GRAIN and r.mean
    }
    out = []
    for r in rows:
        grain = grains.get((r.env, r.np))
        if r.suite != BSP_SUITE or r.metric != BSP_SLOWDOWN or r.mean is None or not grain:
            continue
        out.append(
            ScaleMeasured(
                env=r.env,
                cores=r.np or 1,
                grain_ns=1e3 * grain,
                slowdown_pct=r.mean,
                low_pct=r.ci_low,
                high_pct=r.ci_high,
            )
        )
    return out


def _with_overhead(measured: list[ScaleMeasured]) -> list[ScaleMeasured]:
    """Each VM's measured noise overhead against native at the same ranks (the same
    work, whose quiet time is each environment's own): (1 + s_vm) / (1 + s_native) - 1,
    the same definition as the prediction's."""
    native = {m.cores: m.slowdown_pct for m in measured if m.env == NATIVE}
    out = []
    for m in measured:
        base = native.get(m.cores)
        if m.env != NATIVE and base is not None:
            m = m.model_copy(
                update={"overhead_pct": 100.0 * ((100 + m.slowdown_pct) / (100 + base) - 1)}
            )
        out.append(m)
    return out


def _checked(
    m: ScaleMeasured, traces: Sequence[Sequence[int]], params: ScaleParams
) -> ScaleMeasured:
    """A measured point with the prediction from the same run's noise beside it, at its
    own ranks and grain (the quiet grain the bsp suite measured in that environment)."""
    p = predict(m.env, traces, replace(params, grain_ns=m.grain_ns, cores=(m.cores,)))
    (point,) = p.curve.points
    return m.model_copy(
        update={
            "predicted_pct": point.slowdown_pct,
            "predicted_low_pct": point.slowdown_low_pct,
            "predicted_high_pct": point.slowdown_high_pct,
        }
    )


def _predict_all(
    runs: Mapping[str, Sequence[RawRun]],
    grains: Sequence[float],
    params: Mapping[str, ScaleParams],
    notes: list[str],
) -> tuple[list[ScaleCurve], list[ScaleOverhead]]:
    """Every environment at every grain; each VM against native where both are."""
    curves: list[ScaleCurve] = []
    overheads: list[ScaleOverhead] = []
    for grain in grains:
        done: dict[str, Prediction] = {}
        for env, env_params in params.items():
            try:
                done[env] = predict(env, _traces(runs[env]), replace(env_params, grain_ns=grain))
            except BenchmarkError as exc:
                notes.append(
                    f"{env}: no prediction at a grain of {grain / 1e3:g} us: {exc.message}"
                )
        curves += [p.curve for p in done.values()]
        if NATIVE in done:
            for env, p in done.items():
                if env != NATIVE:
                    overheads += overhead_at_scale(p, done[NATIVE])
    return curves, overheads


def scale_report(
    runs: Mapping[str, Sequence[RawRun]],
    rows: Sequence[Row],
    request: ScaleRequest,
    confidence: float,
) -> ScaleReport:
    """Predict every environment with noise traces at every grain and core count, and
    beside each bsp measurement; what could not be predicted is said in the notes."""
    notes: list[str] = []
    if request.noise_from is not None:
        notes.append(f"noise traces from the latest run in {request.noise_from}")
    if not runs:
        notes.append(
            "no noise traces in this run: run the noise suite (hpcvm bench --suite noise) "
            "for a prediction at scale, or give another run's with --scale-noise"
        )
    envs = env_order(runs)
    ran = max((len(run) for env_runs in runs.values() for run in env_runs), default=1)
    cores = figure_cores(request.cores, ran)
    latencies = {e: _latency(e, rows, request.latency_ns) for e in envs}
    params = {
        env: ScaleParams(
            grain_ns=request.grains_ns[0],
            cores=cores,
            latency_ns=latencies[env].latency_ns,
            resamples=request.resamples,
            confidence=confidence,
            seed=request.seed,
        )
        for env in envs
    }
    curves, overheads = _predict_all(runs, request.grains_ns, params, notes)
    measured = []
    for m in _with_overhead(_measured(rows)):
        try:
            if m.env not in runs:
                raise BenchmarkError("no noise traces of this environment in the run")
            m = _checked(m, _traces(runs[m.env]), params[m.env])
        except BenchmarkError as exc:
            notes.append(f"{m.env}: bsp np {m.cores} has no prediction beside it: {exc.message}")
        measured.append(m)
    if runs and NATIVE not in runs:
        notes.append("no native noise traces: no overhead against native, only slowdowns")
    return ScaleReport(
        cores=cores,
        asked=tuple(request.cores),
        ran=ran,
        grains_ns=tuple(request.grains_ns),
        latencies=tuple(latencies.values()),
        curves=tuple(curves),
        overheads=tuple(overheads),
        measured=tuple(measured),
        notes=tuple(notes),
    )
