"""``cluster checkpoint``: save every VM of a job at one moment, on the batch node.

The order is the point: every VM is paused before any is saved, so no message between
the guests is half sent (a TCP segment is either in a guest's memory or acknowledged),
and the guests' connections survive the restore. Each phase (check, pause, save,
resume) is one step of the batch system with a task per node (tasks/checkpoint_node.py),
and the next begins only when the step has ended on every node.

The job's checkpoint directory (job/checkpoint_model.py) is written into a hidden sibling
that every node writes its VM's directory into, then the manifest last, then one
rename: it exists complete or not at all. A failure removes the partial directory and
runs the VMs again; ``--resume`` aside, the VMs are taken down after the save (as
``cluster down``), and the job goes on from the directory: ``cluster up --restore``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcvm.cluster.batch.base import BatchSystem
from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.batch.spawn import internal_argv
from hpcvm.cluster.commands import control
from hpcvm.cluster.job import checkpoint_series as series
from hpcvm.cluster.job import state
from hpcvm.cluster.job.checkpoint_model import (
    KEY_FILE,
    MANIFEST,
    JobManifest,
    SavedVm,
)
from hpcvm.cluster.job.spec import ClusterSpec, NodeEvent
from hpcvm.cluster.job.state import ClusterRecord
from hpcvm.cluster.tasks.checkpoint_node import NodeResult, NodeVm, Phase, parse_results
from hpcvm.errors import HpcvmError, RuntimeFailure
from hpcvm.runtime.checkpoint import directory as checkpoint_dir
from hpcvm.signals import signals_deferred

STEP_NAME = "hpcvm-checkpoint"
PHASE_TIMEOUT = 1800.0  # seconds for one phase on every node (a save writes all RAM)

Say = Callable[[str], None]


@dataclass(frozen=True)
class JobSaved:
    directory: Path
    manifest: JobManifest
    results: list[NodeResult]  # each node's save
    paused_seconds: float  # from the pause step's start to the end of the resume step
    #                        (taken down: to the end of the save step)


def checkpoint(
    name: str,
    directory: Path,
    *,
    resume_after: bool,
    say: Say,
    keeper: bool = False,
    in_series: bool = False,
) -> JobSaved:
    """Check, pause, save every VM of cluster ``name`` into ``directory``, then take the
    job's VMs down (or run them on). On failure the VMs run again and no directory is
    left. A Ctrl-C or SIGTERM waits until the VMs run again or are saved: a phase is not
    cut short on some nodes while it goes on on others. ``in_series``: ``directory`` is
    a series of checkpoints (cluster/commands/keeper.py) and this one becomes its next member,
    numbered while the job's lock is held. ``keeper``: taken by the job's keeper
    (cluster/commands/keeper.py), which other writers wait for."""
    if not in_series:
        checkpoint_dir.check_target(directory)
    with state.one_writer(name, keeper=keeper):
        target = checkpoint_dir.check_target(
            series.next_member(directory) if in_series else directory
        )
        record, ready = _ready_vms(name)
        spec = _saved_spec(record)
        _phase(record, ready, "check", target.parent)
        partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        with signals_deferred():
            saved = _save_all(record, ready, spec, partial, target, say)
            if resume_after:
                _phase(record, ready, "resume", target)
                say(f"{name}: every VM runs again")
                paused = time.monotonic() - saved.began
            else:
                paused = saved.manifest.pause_seconds
                control.take_down(record, say)
        return JobSaved(saved.directory, saved.manifest, saved.results, paused)


@dataclass(frozen=True)
class _Written:
    directory: Path
    manifest: JobManifest
    results: list[NodeResult]
    began: float


def _save_all(
    record: ClusterRecord,
    ready: list[NodeEvent],
    spec: ClusterSpec,
    partial: Path,
    target: Path,
    say: Say,
) -> _Written:
    """Pause every VM, save them all into ``partial``, then commit it as ``target``.
    Whatever fails on the way, the partial directory goes and every VM runs again."""
    began = time.monotonic()
    try:
        _phase(record, ready, "pause", partial)
        say(f"{record.name}: every VM paused")
        results = _phase(record, ready, "save", partial)
        manifest = JobManifest(
            name=record.name,
            job_id=record.job_id,
            saved_at=time.time(),
            spec=spec.model_copy(update={"migration_secret": ""}),
            network=record.network,
            vcpus=record.vcpus,
            vms=tuple(
                SavedVm(index=e.index, node=e.node, vm=e.vm, address=e.address or "") for e in ready
            ),
            detached=record.detached,
            key_sha256=_copy_keys(record.name, partial),
            pause_seconds=round(time.monotonic() - began, 6),
        )
        checkpoint_dir.commit_directory(
            partial, MANIFEST, manifest.model_dump_json(indent=2), target
        )
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        with contextlib.suppress(HpcvmError):
            _phase(record, ready, "resume", target.parent)
        raise
    return _Written(target, manifest, results, began)


def _ready_vms(name: str) -> tuple[ClusterRecord, list[NodeEvent]]:
    """The record and every node's ``ready`` event, in node order; refused when the
    job is not wholly up."""
    record, latest, alive = control.status(name)
    ready = sorted((e for e in latest if e.event == "ready"), key=lambda e: e.index)
    if not alive or len(ready) != len(record.nodes):
        raise RuntimeFailure(
            f"cluster {name} is not up on every node (see hpcvm cluster ps {name}): "
            "only a whole job is checkpointed"
        )
    return record, ready


def _saved_spec(record: ClusterRecord) -> ClusterSpec:
    """The spec every node planned from, as the holder's tasks got it."""
    spec = state.read_spec(record.name)
    if spec is None:
        raise RuntimeFailure(
            f"cluster {record.name} was started by an older hpcvm (no spec in its state): "
            "it cannot be checkpointed; take it down and start it again"
        )
    return spec


def _phase(
    record: ClusterRecord, ready: list[NodeEvent], action: str, directory: Path
) -> list[NodeResult]:
    """One phase as a step on every node; every node's result, or RuntimeFailure
    naming each node that failed and why."""
    batch = get_batch(record.batch)
    phase = Phase.model_validate(
        {
            "action": action,
            "batch": record.batch,
            "vms": {e.node: NodeVm(vm=e.vm, index=e.index) for e in ready},
            "directory": str(directory),
        }
    )
    argv = batch.step_argv(
        control.allocation_of(record),
        STEP_NAME,
        [*internal_argv("checkpoint-node"), phase.model_dump_json()],
    )
    stdout, stderr, code = run_step(batch, record, argv, action)
    try:
        results = parse_results(stdout)
    except ValueError as exc:
        raise RuntimeFailure(f"the {action} step answered garbled lines ({exc})") from None
    failed = [r for r in results if not r.ok]
    missing = sorted(set(phase.vms) - {r.node for r in results})
    if failed or missing:
        said = [f"{r.node}: {r.message}" for r in failed]
        said += [f"{n}: no answer ({_why_silent(n, code, stderr)})" for n in missing]
        raise RuntimeFailure(
            f"cluster checkpoint of {record.name}: {action} failed on {'; '.join(said)}"
        )
    return results


def run_step(
    batch: BatchSystem,
    record: ClusterRecord,
    argv: list[str],
    action: str,
    *,
    name: str = STEP_NAME,
    env: dict[str, str] | None = None,
    timeout: float = PHASE_TIMEOUT,
) -> tuple[str, str, int]:
    """Run one phase's step (called ``name``) to its end; past ``timeout`` the step
    is ended on every node (not only the local srun) before RuntimeFailure, so no task
    goes on saving while the VMs are resumed."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        step = batch.find_step(control.allocation_of(record), name)
        if step is not None:
            batch.signal_step(step, None)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeFailure(
            f"the {action} step did not end on every node within {timeout:g} s; it was ended"
        ) from None
    return stdout, stderr, proc.returncode


def _why_silent(node: str, code: int, stderr: str) -> str:
    """Why ``node``'s task gave no answer: the batch system's line about that node's
    task where it printed one (srun: ``error: node4: task 1: Killed``), else its last
    line. When one task is killed, srun ends the others too: the node named is the
    one whose task died."""
    mine = [line.strip() for line in stderr.splitlines() if f" {node}: task " in line]
    return f"step exit {code}: {mine[-1] if mine else tail(stderr)}"


def tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "nothing said"


def _copy_keys(name: str, partial: Path) -> dict[str, str]:
    """The job's key pair into the checkpoint (private, fsynced); their SHA-256."""
    source = state.cluster_dir(name)
    digests = {}
    for file_name in (KEY_FILE, f"{KEY_FILE}.pub"):
        entry = checkpoint_dir.copy_hashed(source / file_name, partial / file_name)
        digests[file_name] = entry.sha256
    return digests
