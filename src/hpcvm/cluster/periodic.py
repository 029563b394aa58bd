"""Periodic checkpoints of a cluster job: ``cluster up --checkpoint-every``.

A checkpoint at the time limit (docs/examples/hpcvm-checkpoint-job.sh) saves a job
that is warned. A node that crashes gives no warning: only a checkpoint taken before
it saves the work done so far. So ``cluster up --checkpoint-every DURATION
--checkpoint-dir SERIES`` starts a keeper on the batch node (``python -m
hpcvm.cluster.internal keeper NAME PLAN``): every DURATION it runs ``cluster
checkpoint --resume`` into a new directory of the series, ``SERIES/checkpoint-NNNNNN``,
and once that one is complete removes all but the newest ``--checkpoint-keep``. A
checkpoint exists whole or not at all (cluster/checkpoint.py), so a node that dies
during a save leaves the last complete one; ``cluster up --restore SERIES`` (a
requeued job's next start) restores the newest complete one.

What each checkpoint cost is kept beside them, in ``SERIES/checkpoints.jsonl`` (one
:class:`Taken` per line: how long the VMs stood still, the bytes written, or why it
failed) and said in ``SERIES/checkpoints.log``; ``cluster ps`` shows it, and ``cluster
wait`` says each one as it happens (in the job's output). A failed checkpoint (a full
disk, a node that stopped answering) leaves the VMs running and the last complete
checkpoint in place; the keeper tries again at the next interval.

The keeper ends when the cluster does (``down``, the job's end, its holder gone). It
holds the cluster's lock while it saves; any other writer (``down``, ``checkpoint``,
``exec --detach``) waits for it rather than failing (state.one_writer), and when one
of those holds the lock the keeper tries again a little later.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from hpcvm.cluster import state
from hpcvm.cluster.checkpoint_model import PeriodicCheckpoints
from hpcvm.cluster.checkpoint_series import PREFIX, next_member, prune
from hpcvm.cluster.spawn import internal_argv
from hpcvm.errors import BusyError, HpcvmError
from hpcvm.model import Frozen

HISTORY = "checkpoints.jsonl"
LOG = "checkpoints.log"
POLL = 1.0  # seconds between the keeper's looks at whether its cluster still runs
BUSY_RETRY = 5.0  # seconds before the keeper tries again when another writer holds the lock
MIN_EVERY = 1.0  # seconds; shorter than a save takes is no interval at all


class Taken(Frozen):
    """One periodic checkpoint, saved or failed, as the series' history keeps it."""

    seq: int
    at: float  # when it began (Unix time)
    ok: bool
    seconds: float  # from its start to the VMs running again (or the failure)
    paused_seconds: float | None = None  # how long the VMs stood still
    bytes: int | None = None  # state and disk written
    path: str = ""
    error: str = ""


# -- the history ------------------------------------------------------------------------


def history(series: Path) -> list[Taken]:
    """Every periodic checkpoint the series' keepers recorded, oldest first (a line cut
    short by a keeper killed while writing it is skipped)."""
    try:
        lines = (series / HISTORY).read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []
    taken: list[Taken] = []
    for line in lines:
        with contextlib.suppress(ValueError):
            taken.append(Taken.model_validate_json(line))
    return taken


def _record(series: Path, taken: Taken) -> None:
    fd = os.open(series / HISTORY, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (taken.model_dump_json() + "\n").encode())
    finally:
        os.close(fd)


def describe(name: str, taken: Taken) -> str:
    """One line about one periodic checkpoint, for the log, ``wait`` and ``ps``."""
    when = time.strftime("%H:%M:%S", time.localtime(taken.at))
    if not taken.ok:
        return (
            f"cluster {name}: periodic checkpoint {taken.seq} at {when} FAILED after "
            f"{taken.seconds:.1f} s: {taken.error}; the VMs run on, the last complete "
            "checkpoint stays"
        )
    size = (taken.bytes or 0) / 2**20
    return (
        f"cluster {name}: periodic checkpoint {taken.seq} at {when} saved in {taken.path} "
        f"({size:.1f} MiB) in {taken.seconds:.1f} s; the VMs stood still "
        f"{taken.paused_seconds or 0.0:.2f} s"
    )


# -- the keeper ---------------------------------------------------------------------------


def start(name: str, plan: PeriodicCheckpoints) -> int:
    """Start the keeper of cluster ``name`` (up has made it) and note it in the record;
    its pid. Its output goes to the series' log."""
    series = Path(plan.directory)
    with state.one_writer(name):
        record = state.read_record(name)
        with (series / LOG).open("ab") as log:
            keeper = subprocess.Popen(
                [*internal_argv("keeper"), name, plan.model_dump_json()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=series,
                start_new_session=True,  # a Ctrl-C in the user's terminal is not its end
            )
        state.write_record(record.model_copy(update={"periodic": plan, "keeper_pid": keeper.pid}))
    return keeper.pid


def run(name: str, plan_json: str) -> int:
    """The keeper's loop (module doc); returns when the cluster is gone."""
    plan = PeriodicCheckpoints.model_validate_json(plan_json)
    series = Path(plan.directory)
    job = state.read_record(name).job_id
    next_at = time.monotonic() + plan.every
    while _still_up(name, job):
        left = next_at - time.monotonic()
        if left > 0:
            time.sleep(min(left, POLL))
            continue
        try:
            taken = take(name, series)
        except BusyError:
            next_at = time.monotonic() + BUSY_RETRY  # down, checkpoint or exec: not ours
            continue
        _record(series, taken)
        _say(describe(name, taken))
        if taken.ok:
            for path in prune(series, plan.keep):
                _say(f"cluster {name}: removed {path.name} (--checkpoint-keep {plan.keep})")
        next_at = time.monotonic() + plan.every
    return 0


def take(name: str, series: Path) -> Taken:
    """One checkpoint of the running job as the next of ``series``; the VMs run on
    after it. A failure is returned as such (BusyError is raised: someone else holds
    the job, and this checkpoint did not begin)."""
    from hpcvm.cluster import checkpoint

    at, began = time.time(), time.monotonic()
    seq = int(next_member(series).name[len(PREFIX) :])  # a failure's number, for the log
    try:
        saved = checkpoint.checkpoint(
            name, series, resume_after=True, say=_say, periodic=True, in_series=True
        )
    except BusyError:
        raise
    except (HpcvmError, OSError) as exc:
        error = " ".join(str(exc).split()) or type(exc).__name__
        return Taken(seq=seq, at=at, ok=False, seconds=time.monotonic() - began, error=error)
    return Taken(
        seq=int(saved.directory.name[len(PREFIX) :]),
        at=at,
        ok=True,
        seconds=time.monotonic() - began,
        paused_seconds=saved.paused_seconds,
        bytes=sum(r.state_bytes + r.disk_bytes for r in saved.results),
        path=str(saved.directory),
    )


def _still_up(name: str, job: str) -> bool:
    """Whether the cluster this keeper serves still runs: its record is there, of the
    same job, and its holder lives."""
    try:
        record = state.read_record(name)
    except (HpcvmError, OSError, ValueError):
        return False
    return record.job_id == job and state.holder_alive(record)


def _say(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write(f"{stamp} hpcvm: {message}\n")
    sys.stdout.flush()


# -- what an interval costs ---------------------------------------------------------------


def lost_fraction(every: float, cost: float, mtbf: float) -> float:
    """First-order fraction of run time lost at checkpoint interval ``every`` (Young,
    1974): each checkpoint's stand-still ``cost`` per interval, plus half an interval of
    work redone per failure (mean time between failures ``mtbf``)."""
    return cost / every + every / (2.0 * mtbf)


def young_interval(cost: float, mtbf: float) -> float:
    """The interval that minimises ``lost_fraction``: sqrt(2 C M) (Young, 1974)."""
    return math.sqrt(2.0 * cost * mtbf)


def daly_interval(cost: float, mtbf: float) -> float:
    """Daly's (2006) higher-order optimum, for restarts whose cost is small against the
    MTBF: sqrt(2CM) [1 + (1/3) sqrt(C/2M) + (1/9) (C/2M)] - C while C < 2M, else M."""
    if cost >= 2.0 * mtbf:
        return mtbf
    r = cost / (2.0 * mtbf)
    return math.sqrt(2.0 * cost * mtbf) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - cost
