"""What the store holds, as typed records (the read API other stages use).

Records are plain data decoded from the database: JSON columns come back as dicts, the
``np`` of a suite that ignores the process count (noise) is ``None``. Writing uses
``NewEnvironment`` and ``NewSample``; reading returns the ``*Record`` types with ids.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from hpcvm.model import Frozen

RunStatus = Literal["running", "finished", "interrupted", "failed", "abandoned"]
# "abandoned" is never written: a run recorded as running whose writer no longer holds
# the results directory's lock (killed with SIGKILL, a power loss) reads back as it.
# an environment kind's name (native, container, vm, a plugin's: bench/envs/kinds.py); the
# store keeps any, and a reader without the kind's plugin still shows its rows
EnvKind = Annotated[str, StringConstraints(min_length=1, pattern=r"^[a-z][a-z0-9-]*$")]


class RunRecord(Frozen):
    """One ``hpcvm bench`` run."""

    id: int
    args: dict[str, Any]
    host: dict[str, Any] | None
    seed: int
    confidence: float
    started_at: float
    finished_at: float | None
    elapsed_s: float  # time spent measuring, summed over every process that resumed it
    status: RunStatus
    stop_reason: str | None  # target, max-reps, max-time, fixed, all-failed; None while running
    stop_detail: str | None  # e.g. the widest interval when it stopped
    error: str | None
    warnings: tuple[str, ...]
    hpcvm_version: str
    # the environment each warning is about, by the warning's text ("vm:hpc" for a plan
    # warning of vm:hpc); a warning not here is about the whole run
    warning_envs: dict[str, str] = Field(default_factory=dict)
    writer: str | None = None  # the live writer (pid, host, start) while it runs

    @property
    def status_text(self) -> str:
        """The status as a person reads it: who writes a run in progress, and what to do
        with one whose writer is gone."""
        if self.status == "running" and self.writer:
            return f"running (in progress: {self.writer})"
        if self.status == "abandoned":
            return "abandoned (its writer died before finishing: continue it with --resume)"
        if self.status == "failed":
            why = self.error or "no reason recorded"
            return f"failed: {why} (start a new run in this directory, or continue with --resume)"
        return self.status


class NewEnvironment(Frozen):
    """An environment as the runner describes it before its first sample."""

    name: str  # "native", "container", "vm:hpc", "vm:hpc+e1000"
    kind: EnvKind
    profile: str | None = None
    plan: dict[str, Any] | None = None  # VMPlan as JSON
    accel: str  # "native", "kvm", "tcg"
    cpu_model: str = ""
    versions: dict[str, str] = Field(default_factory=dict)
    vcpus: int
    memory_bytes: int
    # a VM variant's keys (bench/envs/variants.py: {"nic": "e1000", "page": 4096}); {} else
    variant: dict[str, str | int] = Field(default_factory=dict)


class EnvironmentRecord(NewEnvironment):
    id: int
    run_id: int


class MetricRecord(Frozen):
    """One figure of one sample; ``value`` None means that figure failed (``error``)."""

    metric: str
    unit: str
    higher_is_better: bool
    value: float | None
    error: str | None = None


class SampleKey(Frozen):
    """What identifies a sample within a run (what ``--resume`` skips when present)."""

    env: str
    suite: str
    np: int | None
    repetition: int
    warmup: bool


class NewSample(Frozen):
    """One finished run of one suite in one environment, as the runner records it."""

    env: str
    suite: str
    np: int | None
    repetition: int
    warmup: bool
    position: int  # place of the environment in its block's interleaved order
    ok: bool
    error: str | None = None
    log_path: str | None = None
    workdir: str | None = None
    started_at: float
    host_seconds: float | None = None
    guest_seconds: float | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    metrics: tuple[MetricRecord, ...] = ()

    @property
    def key(self) -> SampleKey:
        return SampleKey(
            env=self.env,
            suite=self.suite,
            np=self.np,
            repetition=self.repetition,
            warmup=self.warmup,
        )


class SampleRecord(NewSample):
    id: int
    run_id: int
