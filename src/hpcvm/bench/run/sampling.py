"""One sample: prepare the suite's inputs, run its argv in an environment, parse its
metrics, and write its log, whatever happens; the loop (runner.py) records it
(recording.py)."""

from __future__ import annotations

import shlex
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcvm.bench.core.metrics import MetricValue
from hpcvm.bench.core.suite import DescribesSamples, Suite, WarmsUpSmaller
from hpcvm.bench.envs.environments import CLEAN_ENV, Environment, RunOutput
from hpcvm.bench.results.outdir import slug
from hpcvm.bench.run.cells import Cell
from hpcvm.errors import HpcvmError
from hpcvm.store import MetricRecord, NewSample

LOGS = "logs"
WORK = "work"


@dataclass(frozen=True)
class SampleSpot:
    """Where one sample stands in the run: its environment and cell, its repetition
    (``block``), whether it is a warm-up, its position in the block, the run's
    directory."""

    env: str
    cell: Cell
    block: int
    warmup: bool
    position: int
    out_dir: Path

    def paths(self) -> tuple[Path, Path]:
        """Its work directory and its log."""
        np_part = "" if self.cell.np is None else f"-np{self.cell.np}"
        warm = "-warmup" if self.warmup else ""
        stem = f"{slug(self.cell.suite.name)}{np_part}-r{self.block}{warm}"
        return (
            self.out_dir / WORK / slug(self.env) / stem,
            self.out_dir / LOGS / slug(self.env) / f"{stem}.log",
        )


def take_sample(
    env: Environment, spot: SampleSpot, *, timeout: float, sizing_memory: int
) -> NewSample:
    """Run one sample in ``env`` and return it as the store records it (failed, with
    its reason, when anything went wrong); its log is written either way."""
    cell = spot.cell
    workdir, log = spot.paths()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    argv: list[str] = []
    output: RunOutput | None = None
    values: list[MetricValue] = []
    error: str | None = None
    try:
        prepare = cell.suite.prepare
        if spot.warmup and isinstance(cell.suite, WarmsUpSmaller):
            prepare = cell.suite.prepare_warmup
        argv = prepare(workdir, cell.np or 1, sizing_memory)
        output = env.run(argv, workdir, timeout, outputs=cell.suite.output_files)
        if output.timed_out:
            error = f"timed out after {timeout:g} s"
        else:
            values = cell.suite.parse(workdir, output.stdout, output.stderr, output.exit_code)
    except HpcvmError as exc:
        error = exc.message
    _write_log(log, spot, workdir, argv, output, error)
    return NewSample(
        env=spot.env,
        suite=cell.suite.name,
        np=cell.np,
        repetition=spot.block,
        warmup=spot.warmup,
        position=spot.position,
        ok=error is None,
        error=error,
        log_path=str(log),
        workdir=str(workdir),
        started_at=started,
        host_seconds=None if output is None else output.host_seconds,
        guest_seconds=None if output is None else output.guest_seconds,
        evidence=_evidence(cell.suite, workdir, output),
        metrics=tuple(_record(v) for v in values)
        if error is None
        else _failed_metrics(cell.suite, error),
    )


def _evidence(suite: Suite, workdir: Path, output: RunOutput | None) -> dict[str, Any]:
    """The environment's evidence, plus what the suite reads from the run about itself
    (NPB's verification, class and process counts) under ``facts``."""
    if output is None:
        return {}
    evidence = dict(output.evidence)
    if isinstance(suite, DescribesSamples):
        facts = suite.sample_facts(workdir, output.stdout, output.stderr, output.exit_code)
        if facts:
            evidence["facts"] = facts
    return evidence


def _failed_metrics(suite: Suite, error: str) -> tuple[MetricRecord, ...]:
    """A failed sample names the headline metrics it failed to measure, so the summary
    shows the cell as failed (n 0, the reason) instead of dropping it."""
    return tuple(
        MetricRecord(
            metric=m.name, unit=m.unit, higher_is_better=m.higher_is_better, value=None, error=error
        )
        for m in suite.metrics
    )


def _record(value: MetricValue) -> MetricRecord:
    return MetricRecord(
        metric=value.metric.name,
        unit=value.metric.unit,
        higher_is_better=value.metric.higher_is_better,
        value=value.value,
        error=value.error,
    )


def _write_log(
    path: Path,
    spot: SampleSpot,
    workdir: Path,
    argv: Sequence[str],
    output: RunOutput | None,
    error: str | None,
) -> None:
    """Everything a person needs to see what this sample did and why it failed."""
    cell = spot.cell
    lines = [
        f"env: {spot.env}",
        f"suite: {cell.suite.name}",
        f"np: {'-' if cell.np is None else cell.np}",
        f"repetition: {spot.block}{' (warm-up)' if spot.warmup else ''}",
        f"workdir: {workdir}",
        f"argv: {shlex.join(argv) if argv else '-'}",
        f"environment: clean ({shlex.join(CLEAN_ENV)} ...), natively and in a guest",
    ]
    if output is not None:
        guest = "-" if output.guest_seconds is None else f"{output.guest_seconds:.6f}"
        lines += [
            f"exit code: {output.exit_code}{' (timed out)' if output.timed_out else ''}",
            f"host seconds: {output.host_seconds:.6f}",
            f"guest seconds: {guest}",
        ]
    lines.append(f"result: {'ok' if error is None else 'FAILED: ' + error}")
    text = "\n".join(lines) + "\n"
    if output is not None:
        text += f"--- stdout ---\n{output.stdout}\n--- stderr ---\n{output.stderr}\n"
    path.write_text(text)
