"""What a report is drawn from: one run's metadata, its summary rows and its evidence.

The report stage reads the results database once (``load.py``) into this model and every
output (figures, HTML, Markdown, JSON, comparisons) is a pure function of it, so the
outputs cannot disagree with each other and tests can build the model from any real run.

``Row`` carries the fields of ``hpcvm results --json`` (one environment x suite x np x
metric) plus the sample values behind the mean, which ``--compare`` needs for its own
interval. Native rows have no overhead (``overhead_pct`` None). An overhead with
``overhead_pct`` set but no interval bounds is *unbounded* (Fieller's set is not an
interval): figures and tables show it as such and never invent bounds.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from hpcvm.model import Frozen
from hpcvm.stats.scale import ScaleCurve, ScaleOverhead

NATIVE = "native"
WarningKind = Literal["tcg", "drift", "failed", "run", "summary"]


class Row(Frozen):
    """Summary of one metric in one environment, suite and process count.

    The fields of ``hpcvm results --json`` (``hpcvm.bench.results.results.ResultRow``), with two
    differences: ``overhead_pct`` also holds the point estimate (ratio of means) when no
    finite interval exists, so a figure can draw it as unbounded; ``values`` keeps the
    samples behind ``mean`` for ``--compare``.
    """

    env: str
    suite: str
    metric: str
    unit: str
    higher_is_better: bool
    np: int | None  # None when the suite ignores the process count (noise)
    detail: bool = False  # a per-CPU detail metric: tables only, not figures
    n: int
    failed: int = 0  # samples of this cell that failed or lack this metric
    failure_reason: str | None = None  # the most frequent reason, with its share
    facts: dict[str, str] = Field(default_factory=dict)  # e.g. NPB's verification counts
    mean: float | None  # None when every sample failed
    stdev: float | None = None
    ci_low: float | None
    ci_high: float | None
    interval_note: str = ""  # why the interval should not be trusted (below zero)
    overhead_pct: float | None = None
    overhead_ci_low: float | None = None
    overhead_ci_high: float | None = None
    significant: bool | None = None  # None for native
    overhead_note: str = ""
    outliers: int = 0  # values flagged as outlying (kept)
    robust_pct: float | None = None  # Hodges-Lehmann overhead
    robust_ci_low: float | None = None
    robust_ci_high: float | None = None
    trust_note: str = ""  # why the mean's interval should not be trusted
    interrupts_per_s: float | None = None  # mean total rate: in the guest for a VM
    host_interrupts_per_s: float | None = None
    drift_flagged: int = 0
    drift_unresolved: int = 0
    accel: str = ""
    cpu_model: str = ""
    stop_reason: str | None = None
    warnings: tuple[str, ...] = ()
    values: tuple[float, ...] = ()  # the non-warm-up values behind ``mean``

    @property
    def overhead_bounded(self) -> bool:
        return self.overhead_ci_low is not None and self.overhead_ci_high is not None

    @property
    def is_detail(self) -> bool:
        return self.detail or "@" in self.metric


class PlanSummary(Frozen):
    """A VM plan in the few facts a reader checks first."""

    profile: str
    vcpus: int
    topology: str  # "1 socket x 2 cores x 1 thread"
    pinning: str  # "vCPU 0->PU 0, 1->PU 1" or "not pinned"
    guest_nodes: tuple[str, ...]  # "node 0: vCPUs 0-1, 1 GiB on host node 0"
    memory_backing: str  # "hugetlbfs 2 MiB pages, bound to host node 0"
    cpu_model: str
    clock: str
    emulator_pus: str  # "" when not restricted


class EnvInfo(Frozen):
    """One environment of the run as the store describes it."""

    name: str
    kind: str  # "native", "container" or "vm"
    profile: str | None
    accel: str  # "native", "kvm", "tcg"
    cpu_model: str
    versions: dict[str, str] = Field(default_factory=dict)
    vcpus: int
    memory_bytes: int
    plan: PlanSummary | None = None
    variant: dict[str, str | int] = Field(default_factory=dict)  # bench/envs/variants.py's keys


class HostSummary(Frozen):
    """The host the run measured, summarised from its HostTopology snapshot."""

    hostname: str
    cpu_model: str
    packages: int
    numa_nodes: int
    cores: int
    pus: int
    memory_bytes: int
    kvm: str  # KvmInfo.reason


class InterruptRate(Frozen):
    """Interrupts per second during one env x suite x np's samples, one side.

    ``side`` is "host" (native runs, or the host while a VM runs) or "guest".
    """

    env: str
    suite: str
    np: int | None
    side: str
    samples: int
    total_per_s: float  # mean over samples of the sum over sources
    top_sources: tuple[tuple[str, float], ...] = ()  # highest mean rates first


class DriftInfo(Frozen):
    """Guest clock against host time over one environment's samples (the bench's
    ``clock`` evidence: change of guest-minus-host offset between two agent reads)."""

    env: str
    samples: int  # samples with a clock check
    flagged: int  # drift beyond the limit plus its uncertainty
    unresolved: int  # samples too short for the check to see a drift of the limit
    worst_pct: float  # signed drift of the sample with the largest |drift|, in %
    limit_pct: float
    missing: int = 0  # samples whose guest clock could not be read


class FailedSamples(Frozen):
    """Failed samples of one env x suite x np, with why and where the logs are."""

    env: str
    suite: str
    np: int | None
    count: int
    errors: tuple[str, ...]  # distinct messages
    log_paths: tuple[str, ...]
    samples: int = 0  # every sample of the cell, warm-ups included
    valid: int = 0  # measured samples that succeeded
    reason: str = ""  # the most frequent reason
    reason_count: int = 0
    given_up: bool = False  # warm-up and first repetition failed the same way


class NoiseCurve(Frozen):
    """Detour distribution of one environment's noise runs (all CPUs, all samples).

    ``detour_us[i]``, ``fraction_above[i]``: the fraction of all quanta whose detour
    (duration minus its CPU's fastest quantum in that run) exceeded ``detour_us[i]``.
    A thinned survival function: enough points to draw, not every quantum.
    """

    env: str
    samples: int
    quanta: int
    detour_us: tuple[float, ...]
    fraction_above: tuple[float, ...]


class ScaleMeasured(Frozen):
    """A slowdown measured at the scale the run had (the ``bsp`` suite: ranks computing
    a grain between allreduces), to set beside the prediction made from the noise."""

    env: str
    cores: int
    grain_ns: float
    slowdown_pct: float
    low_pct: float | None = None
    high_pct: float | None = None
    overhead_pct: float | None = None  # against native's measured step, noise part only
    # the prediction from the same run's noise at these cores and this grain
    predicted_pct: float | None = None
    predicted_low_pct: float | None = None
    predicted_high_pct: float | None = None

    @property
    def contained(self) -> bool | None:
        """Whether measurement and prediction agree (None: no prediction): their intervals
        meet. Both estimate the same expected slowdown with their own uncertainty (the
        prediction's is that of the expectation, not of one finite run), so a measured mean
        outside the predicted interval alone is no disagreement; without a measured
        interval, the mean must be inside the predicted one."""
        if self.predicted_low_pct is None or self.predicted_high_pct is None:
            return None
        low = self.slowdown_pct if self.low_pct is None else self.low_pct
        high = self.slowdown_pct if self.high_pct is None else self.high_pct
        return low <= self.predicted_high_pct and self.predicted_low_pct <= high


class ScaleLatency(Frozen):
    """The collective's per-stage latency used for one environment, and where from."""

    env: str
    latency_ns: float
    source: str  # "netpipe latency_1B", "--scale-latency", "default"


class ScaleReport(Frozen):
    """``report --scale``: per environment and grain, the predicted step time and
    slowdown against core count (stats/scale.py); per VM, its predicted overhead against
    native; and what was measured at the run's own scale."""

    cores: tuple[int, ...]  # every core count predicted (the figure's x)
    asked: tuple[int, ...]  # the core counts asked for (the table's columns)
    ran: int  # CPUs per noise run: the scale the run itself had
    grains_ns: tuple[float, ...]
    latencies: tuple[ScaleLatency, ...]
    curves: tuple[ScaleCurve, ...]
    overheads: tuple[ScaleOverhead, ...]
    measured: tuple[ScaleMeasured, ...] = ()
    notes: tuple[str, ...] = ()  # what could not be predicted, and why

    def grain_of(self, m: ScaleMeasured) -> float | None:
        """The predicted grain a measured point is shown with: the nearest on a log scale
        within a factor of two of its own (the bsp grain is calibrated, so never exact)."""
        near = [g for g in self.grains_ns if 0.5 <= g / m.grain_ns <= 2.0]
        return min(near, key=lambda g: abs(math.log(g / m.grain_ns)), default=None)


class ReportWarning(Frozen):
    kind: WarningKind
    text: str
    env: str | None = None


class RunInfo(Frozen):
    """The run itself: what was asked, how it went and what stopped it."""

    id: int
    results_dir: str
    status: str
    stop_reason: str | None
    confidence: float
    started_at: float
    finished_at: float | None
    elapsed_s: float
    seed: int
    hpcvm_version: str
    args: dict[str, Any] = Field(default_factory=dict)
    repetitions: dict[str, int] = Field(default_factory=dict)  # env -> measured blocks
    warmup_discarded: int = 0


class ReportData(Frozen):
    """Everything one report shows; see the module docstring."""

    run: RunInfo
    host: HostSummary | None
    envs: tuple[EnvInfo, ...]
    rows: tuple[Row, ...]
    interrupts: tuple[InterruptRate, ...] = ()
    drift: tuple[DriftInfo, ...] = ()
    failures: tuple[FailedSamples, ...] = ()
    noise: tuple[NoiseCurve, ...] = ()
    warnings: tuple[ReportWarning, ...] = ()
    notes: tuple[str, ...] = ()  # what the report could not show and why
    scale: ScaleReport | None = None  # only when asked (``report --scale``)

    @property
    def env_names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.envs)

    def env(self, name: str) -> EnvInfo | None:
        return next((e for e in self.envs if e.name == name), None)
