"""The keeper of a cluster job, on its batch node: periodic checkpoints (``cluster up
--checkpoint-every``) and the answer to a drained node (``cluster up --on-drain``).

A checkpoint at the time limit (docs/examples/hpcvm-checkpoint-job.sh) saves a job
that is warned. A node that crashes gives no warning: only a checkpoint taken before
it saves the work done so far. So ``cluster up --checkpoint-every DURATION
--checkpoint-dir SERIES`` starts a keeper on the batch node (``python -m
hpcvm.cluster.internal keeper NAME PLAN``): every DURATION it runs ``cluster
checkpoint --resume`` into a new directory of the series, ``SERIES/checkpoint-NNNNNN``,
and once that one is complete removes all but the newest ``--checkpoint-keep``. A
checkpoint exists whole or not at all (cluster/commands/checkpoint.py), so a node that dies
during a save leaves the last complete one; ``cluster up --restore SERIES`` (a
requeued job's next start) restores the newest complete one.

What each checkpoint cost is kept beside them, in ``SERIES/checkpoints.jsonl`` (one
:class:`Taken` per line: how long the VMs stood still, the bytes written, or why it
failed) and said in ``SERIES/checkpoints.log``; ``cluster ps`` shows it, and ``cluster
wait`` says each one as it happens (in the job's output). A failed checkpoint (a full
disk, a node that stopped answering) leaves the VMs running and the last complete
checkpoint in place; the keeper tries again at the next interval.

A node the admin drains (before maintenance, or when its health check fails) is a
failure announced: the keeper asks the batch system every few seconds which of the
job's nodes drain (batch.Drains), and with ``--on-drain migrate`` moves a drained
node's VM to a spare node of the job (``cluster up --spare``; cluster/commands/migrate.py), so
the job loses only the move's stand-still. With no spare left, or ``--on-drain
checkpoint``, it sends the batch script SIGUSR1, as the batch system does before a time
limit: the checkpoint job script saves the job and requeues it, and the batch system
starts it again away from the drained node.

The keeper ends when the cluster does (``down``, the job's end, its holder gone). It
holds the cluster's lock while it saves or moves; any other writer (``down``,
``checkpoint``, ``exec --detach``) waits for it rather than failing
(state.one_writer), and when one of those holds the lock the keeper tries again a
little later.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from hpcvm.cluster.batch.base import BatchSystem, Drains
from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.batch.spawn import internal_argv
from hpcvm.cluster.job import state
from hpcvm.cluster.job.checkpoint_model import PeriodicCheckpoints
from hpcvm.cluster.job.checkpoint_series import PREFIX, next_member, prune
from hpcvm.cluster.job.state import ClusterRecord, OnDrain
from hpcvm.errors import BusyError, HpcvmError, NodeLost, UsageError
from hpcvm.model import Frozen

HISTORY = "checkpoints.jsonl"
LOG = "checkpoints.log"
KEEPER_LOG = "keeper.log"  # in the job's state directory, when there is no series
DRAIN_POLL = 5.0  # seconds between asks which of the job's nodes drain
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
    """Append ``taken`` to the history. A history that cannot be written (the series'
    file system full, its directory gone) is said and the keeper goes on: the VMs run,
    and the next checkpoint may find room again."""
    try:
        fd = os.open(series / HISTORY, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (taken.model_dump_json() + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        _say(f"could not add checkpoint {taken.seq} to {series / HISTORY}: {exc.strerror}")


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


class KeeperPlan(Frozen):
    """What a job's keeper does: periodic checkpoints, the answer to a drained node."""

    periodic: PeriodicCheckpoints | None = None
    on_drain: OnDrain = "none"


def start(name: str, plan: KeeperPlan) -> int:
    """Start the keeper of cluster ``name`` (up has made it) and note it in the record;
    its pid. Its output goes to the series' log, or without one to the job's state
    directory (``keeper.log``)."""
    with state.one_writer(name):
        record = state.read_record(name)
        if plan.periodic is not None:
            where = Path(plan.periodic.directory)
            log_path = where / LOG
        else:
            where = state.cluster_dir(name)
            log_path = where / KEEPER_LOG
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "ab") as log:
            process = subprocess.Popen(
                [*internal_argv("keeper"), name, plan.model_dump_json()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=where,
                start_new_session=True,  # a Ctrl-C in the user's terminal is not its end
            )
        update = {"periodic": plan.periodic, "on_drain": plan.on_drain, "keeper_pid": process.pid}
        state.write_record(record.model_copy(update=update))
    return process.pid


def run(name: str, plan_json: str) -> int:
    """The keeper's loop (module doc); returns when the cluster is gone."""
    plan = KeeperPlan.model_validate_json(plan_json)
    record = state.read_record(name)
    job, periodic = record.job_id, plan.periodic
    drains = Drained(name, plan.on_drain, get_batch(record.batch))
    next_save = time.monotonic() + periodic.every if periodic is not None else math.inf
    while _still_up(name, job):
        drains.look()
        if time.monotonic() < next_save:
            time.sleep(POLL)
            continue
        assert periodic is not None
        series = Path(periodic.directory)
        try:
            taken = take(name, series)
        except BusyError:
            next_save = time.monotonic() + BUSY_RETRY  # down, checkpoint or exec: not ours
            continue
        if not taken.ok and not _still_up(name, job):
            break  # the job went meanwhile (saved at a signal, taken down): none was due
        _record(series, taken)
        _say(describe(name, taken))
        if taken.ok:
            for path in prune(series, periodic.keep):
                _say(f"cluster {name}: removed {path.name} (--checkpoint-keep {periodic.keep})")
        next_save = time.monotonic() + periodic.every
    return 0


class Drained:
    """The keeper's answer to the job's nodes that drain (module doc): each drained
    node's VM moved to a spare once, or the batch script warned once."""

    def __init__(self, name: str, on_drain: OnDrain, batch: BatchSystem) -> None:
        self.name = name
        self.on_drain = on_drain
        self.batch = batch if isinstance(batch, Drains) else None
        self.handled: set[str] = set()
        self.warned = False
        self.next_look = 0.0

    def look(self) -> None:
        """Ask the batch system, at most every DRAIN_POLL seconds; act on what is new."""
        if self.on_drain == "none" or self.batch is None or self.warned:
            return
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + DRAIN_POLL
        try:
            record = state.read_record(self.name)
        except HpcvmError:
            return  # the job is ending: the keeper's loop sees it next
        draining = self.batch.draining((*record.nodes, *record.spare))
        for node in record.nodes:
            if node in draining and node not in self.handled:
                self._answer(record, node, draining[node], draining)

    def _answer(
        self, record: ClusterRecord, node: str, reason: str, draining: dict[str, str]
    ) -> None:
        why = f"node {node} drains ({reason or 'no reason given'})"
        if self.on_drain == "migrate":
            spares = [n for n in record.spare if n not in draining]
            if node == record.nodes[0]:
                why += "; the first VM (it runs mpirun) does not move"
            elif not spares:
                why += "; no spare node is left to move its VM to"
            else:
                moved = self._move(node, spares[0], why)
                if moved is None:
                    return  # another writer holds the job: the next look tries again
                if moved:
                    return
                why += "; moving its VM failed"
        self._warn(record, why)

    def _move(self, node: str, spare: str, why: str) -> bool | None:
        """Move ``node``'s VM to ``spare``: whether it moved (None: not now, busy)."""
        from hpcvm.cluster.commands import migrate

        try:
            moved = migrate.migrate(self.name, node, spare, _say, keeper=True)
        except BusyError:
            return None
        except HpcvmError as exc:
            _say(f"cluster {self.name}: {why}; moving its VM to {spare} failed: {exc}")
            return False
        self.handled.add(node)
        _say(
            f"cluster {self.name}: {why}: moved its VM {moved.vm} to the spare node "
            f"{moved.target}; {moved.stood_still()}"
        )
        return True

    def _warn(self, record: ClusterRecord, why: str) -> None:
        """No move: the batch script is signalled to save the job and requeue it."""
        assert self.batch is not None
        self.warned = True
        if self.batch.warn_job(record.job_id, "USR1"):
            _say(f"cluster {self.name}: {why}: sent the batch script SIGUSR1 (save, requeue)")
        else:
            _say(f"cluster {self.name}: {why}: could not signal the batch script; it runs on")


def take(name: str, series: Path) -> Taken:
    """One checkpoint of the running job as the next of ``series``; the VMs run on
    after it. A failure is returned as such (BusyError is raised: someone else holds
    the job, and this checkpoint did not begin)."""
    from hpcvm.cluster.commands import checkpoint

    at, began = time.time(), time.monotonic()
    seq = int(next_member(series).name[len(PREFIX) :])  # a failure's number, for the log
    try:
        saved = checkpoint.checkpoint(
            name, series, resume_after=True, say=_say, keeper=True, in_series=True
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
    except (UsageError, NodeLost):  # its state is gone (NodeLost: its step ended itself)
        return False
    except (HpcvmError, OSError, ValueError):
        return True  # a read that failed now; the next look tells
    return record.job_id == job and state.holder_alive(record)


def _say(message: str) -> None:
    """One line to the keeper's log; a log that cannot take it (its file system full)
    loses the line, never the keeper."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError):
        sys.stdout.write(f"{stamp} hpcvm: {message}\n")
        sys.stdout.flush()


def interval_text(seconds: float) -> str:
    """An interval as ``--checkpoint-every`` takes it: ``2h``, ``30m``, ``90s``."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


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
