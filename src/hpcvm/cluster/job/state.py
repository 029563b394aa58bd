"""What a cluster job keeps on its batch node, and every file name of it.

``cluster up`` makes a state directory per cluster, ``<runtime dir>/.clusters/NAME``
(next to the VMs' own directories; the dot keeps ``hpcvm ps`` off it), holding:

- ``cluster.json``: the :class:`ClusterRecord` (batch system, job, nodes, the holder's
  pid) that ``ps``, ``exec`` and ``down`` read;
- ``holder.log``: the holder step's output, where the nodes' event lines arrive;
- ``id_job`` and ``id_job.pub``: the job's ssh key pair (job/guest_mpi.py);
- ``spec.json``: the ClusterSpec every node's task planned from (a job checkpoint
  keeps it, cluster/commands/checkpoint.py);
- ``taking-down``: made by ``down`` (or a failing ``up``) before it ends the step, so
  the holder leaves the directory to it.

``.clusters`` is made 0700 and checked as the runtime root is (paths.check_dir): owned
by this user, no symbolic link, nobody else may write it. Each name has one writer at a
time: ``up`` and ``down`` hold ``NAME.lock`` beside the directory (hpcvm.lock: the
kernel drops it with its holder). The directory goes when the cluster is down, however
it went down (``down``, or the holder once the step ends).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from hpcvm.cluster.job.checkpoint_model import KEY_FILE, DetachedExec, PeriodicCheckpoints
from hpcvm.cluster.job.guest_mpi import keygen
from hpcvm.cluster.job.spec import ClusterSpec, NodeEvent, parse_events
from hpcvm.cluster.job.state_files import (
    ENDED_SUFFIX,
    KILLED,
    LOG_FILE,
    TAKING_DOWN,
    ended_path,
    remove_dir,
)

# defined where cluster exec reads them without pydantic (job/view.py); re-exported
from hpcvm.cluster.job.view import CLUSTERS_DIR as CLUSTERS_DIR
from hpcvm.cluster.job.view import RECORD_FILE as RECORD_FILE
from hpcvm.cluster.job.view import OnDrain as OnDrain
from hpcvm.cluster.job.view import cluster_dir as cluster_dir
from hpcvm.cluster.job.view import ended_note as ended_note
from hpcvm.cluster.job.view import record_path
from hpcvm.errors import BusyError, UsageError
from hpcvm.lock import Holder, exclusive, is_held, read_holder
from hpcvm.model import Frozen
from hpcvm.procs import pid_alive
from hpcvm.runtime.hostside import paths

SPEC_FILE = "spec.json"
LOCK_SUFFIX = ".lock"
KEEPER_LABEL = "hpcvm keeper of cluster"  # a periodic checkpoint, a move off a drained node
KEEPER_PATIENCE = 3600.0  # seconds another writer waits for the keeper's work


class ClusterRecord(Frozen):
    """What ``cluster up`` leaves on the batch node for the other commands."""

    name: str
    batch: str = "slurm"  # the batch system's name (records before it had one: Slurm)
    job_id: str
    nodes: tuple[str, ...]  # by VM index: the node that runs it now
    spare: tuple[str, ...] = ()  # the allocation's nodes that run none (cluster migrate)
    holder_pid: int
    network: str  # the VMs' network, e.g. 10.0.0.0/24
    vcpus: int
    # commands `cluster exec --detach` started in the first VM, not yet waited for
    detached: tuple[DetachedExec, ...] = ()
    periodic: PeriodicCheckpoints | None = None  # cluster up --checkpoint-every
    on_drain: OnDrain = "none"  # cluster up --on-drain
    keeper_pid: int | None = None  # the process that does both (cluster/commands/keeper.py)


def clusters_dir() -> Path:
    """The directory of every cluster's state, made if missing (private, 0700) and
    checked as the runtime root is (paths.check_dir): it holds each job's ssh key and
    the locks of ``up`` and ``down``, which another user must not reach or replace."""
    paths.ensure_root()
    directory = paths.runtime_root() / CLUSTERS_DIR
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    paths.check_dir(
        directory,
        "hpcvm's cluster state directory",
        f"it holds your jobs' keys and locks; remove it (`rm -r {directory}`) and run again",
    )
    return directory


def log_path(name: str) -> Path:
    return cluster_dir(name) / LOG_FILE


@contextlib.contextmanager
def one_writer(name: str, *, keeper: bool = False, patient: bool = True) -> Iterator[None]:
    """One ``cluster up`` or ``down`` of a name at a time (hpcvm.lock: dies with its
    holder). The lock file sits beside the state directory, which up and the holder
    remove and remake, so that both processes lock the same file; it goes when released
    (``remove``), and the clusters' directory with it once that is empty.

    The job's keeper (``keeper``: cluster/commands/keeper.py, taking a periodic checkpoint or
    moving a VM off a drained node) says so in the lock; any other writer waits for it
    to end (its work is bounded, and the user's ``down`` or ``checkpoint`` must not fail
    because the job happened to be saving itself), saying once on stderr that it waits
    (unless not ``patient``: a check that only looks). The keeper never waits: it tries
    again later."""
    directory = cluster_dir(name)
    clusters_dir()
    said: list[int] = []

    def outwait(holder: Holder) -> bool:
        if keeper or not patient or not holder.command.startswith(KEEPER_LABEL):
            return False
        if holder.pid not in said:
            said.append(holder.pid)
            sys.stderr.write(
                f"hpcvm: cluster {name}: waiting for its keeper (pid {holder.pid}: a "
                "periodic checkpoint, or a move off a drained node) to finish\n"
            )
        return True

    try:
        with exclusive(
            lock_path(name),
            f"cluster {name!r}",
            f"wait for it to finish, or stop it and run hpcvm cluster down {name}",
            remove=True,
            label=f"{KEEPER_LABEL} {name}" if keeper else None,
            outwait=outwait,
            patience=KEEPER_PATIENCE,
        ):
            yield
    finally:
        with contextlib.suppress(OSError):
            directory.parent.rmdir()


def lock_path(name: str) -> Path:
    """The lock file of cluster ``name``: beside its state directory (one_writer)."""
    directory = cluster_dir(name)
    return directory.parent / f"{directory.name}{LOCK_SUFFIX}"


def keeper_working(name: str) -> bool:
    """Whether the job's keeper holds its lock now (a periodic checkpoint or a move off
    a drained node: the VMs may stand paused, and their agents not answer)."""
    path = lock_path(name)
    holder = read_holder(path)
    return holder is not None and holder.command.startswith(KEEPER_LABEL) and is_held(path)


def has_record(name: str) -> bool:
    return (cluster_dir(name) / RECORD_FILE).is_file()


def read_record(name: str) -> ClusterRecord:
    """Cluster ``name``'s record; NodeLost when its step ended on its own, a UsageError
    when there is no such cluster (job/view.py ``record_path``)."""
    return ClusterRecord.model_validate_json(record_path(name).read_text())


def forget_ended(name: str) -> None:
    """Remove the note: a new ``up`` of the name, or the ``down`` that read it."""
    with contextlib.suppress(OSError):
        ended_path(cluster_dir(name)).unlink()


def write_record(record: ClusterRecord) -> None:
    """Replace the record in one rename: a reader (``ps``, the keeper, ``cluster
    wait``'s watch) never sees it half written, which it took for a cluster gone."""
    path = cluster_dir(record.name) / RECORD_FILE
    partial = path.with_name(f".{RECORD_FILE}.{os.getpid()}")
    partial.write_text(record.model_dump_json())
    partial.replace(path)


def events(name: str) -> list[NodeEvent]:
    """The nodes' events so far, in the order they arrived."""
    log = log_path(name)
    if not log.is_file():
        return []
    return parse_events(log.read_text(errors="replace").splitlines())


def log_lines(name: str) -> list[str]:
    """The holder log's lines that are not events: what the nodes said besides."""
    log = log_path(name)
    if not log.is_file():
        return []
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if not parse_events([line])]


def settled_moves(name: str) -> list[str]:
    """The nodes' lines about moves whose source step died (cluster/tasks/moved.py): where
    the VM is now, which ``cluster migrate``'s failure points the user to (``ps`` shows
    them, ``wait`` relays them as they come)."""
    log = log_path(name)  # read at every look of cluster wait: only its lines are parsed
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [ln for ln in text.splitlines() if KILLED in ln and not parse_events([ln])]


def holder_alive(record: ClusterRecord) -> bool:
    return pid_alive(record.holder_pid)


@contextlib.contextmanager
def claimed(name: str) -> Iterator[Path]:
    """The cluster's state directory, new; removed again if ``up`` fails."""
    directory = cluster_dir(name)
    if has_record(name):
        record = read_record(name)
        if holder_alive(record):
            raise UsageError(
                f"cluster {name!r} is already up (job {record.job_id}): hpcvm cluster down "
                f"{name} first, or choose another --name"
            )
    shutil.rmtree(directory, ignore_errors=True)
    forget_ended(name)
    clusters_dir()
    directory.mkdir(mode=0o700)
    try:
        yield directory
    except BaseException:
        remove(name)
        raise


def mark_taking_down(name: str) -> None:
    """Tell the holder that this process removes the directory (module doc). A holder
    whose step already ended may have removed it: then there is nothing to tell."""
    with contextlib.suppress(FileNotFoundError):
        (cluster_dir(name) / TAKING_DOWN).touch()


def remove(name: str) -> None:
    """The cluster's state directory, and the clusters' directory once it is empty."""
    remove_dir(cluster_dir(name))


def names() -> list[str]:
    """Every cluster with a state directory on this node."""
    clusters = paths.runtime_root() / CLUSTERS_DIR
    if not clusters.is_dir():
        return []
    return sorted(d.name for d in clusters.iterdir() if d.is_dir())


def ended_names() -> list[str]:
    """Clusters whose holder left a note that their step ended on its own, and no state."""
    clusters = paths.runtime_root() / CLUSTERS_DIR
    if not clusters.is_dir():
        return []
    notes = (p for p in clusters.iterdir() if p.name.endswith(ENDED_SUFFIX) and p.is_file())
    named = (p.name.removesuffix(ENDED_SUFFIX) for p in notes)
    return sorted(n for n in named if not (clusters / n).exists())


def remove_if_stale(name: str) -> bool:
    """Remove the state of a cluster nothing runs any more (its holder is gone and no
    ``up`` or ``down`` holds its lock): what a job killed outright leaves, the holder
    having died before it could clean up. Whether it was removed."""
    with contextlib.suppress(BusyError), one_writer(name, patient=False):
        try:
            alive = has_record(name) and holder_alive(read_record(name))
        except ValueError:  # a record cut short: nothing can use it
            alive = False
        if not alive:
            remove(name)
            return True
    return False


def write_spec(directory: Path, spec: ClusterSpec) -> None:
    (directory / SPEC_FILE).write_text(spec.model_dump_json())


def read_spec(name: str) -> ClusterSpec | None:
    """The spec the cluster's nodes got; None for a cluster started before it was kept."""
    path = cluster_dir(name) / SPEC_FILE
    return ClusterSpec.model_validate_json(path.read_text()) if path.is_file() else None


def install_keys(directory: Path, source: Path, sha256: dict[str, str]) -> tuple[str, str]:
    """A saved job's key pair (a restore, cluster/job/checkpoint_model.py) copied into
    ``directory``, private, each checked against its recorded SHA-256 as it is copied:
    (public, private)."""
    from hpcvm.runtime.checkpoint.directory import copy_hashed

    for name in (KEY_FILE, f"{KEY_FILE}.pub"):
        if copy_hashed(source / name, directory / name).sha256 != sha256.get(name):
            raise UsageError(f"job checkpoint {source} is damaged: {name} changed")
    key = directory / KEY_FILE
    return key.with_suffix(".pub").read_text(), key.read_text()


def make_keys(directory: Path, name: str) -> tuple[str, str]:
    """A key pair for this job only (ed25519, no passphrase) in ``directory``:
    (public, private)."""
    key = directory / KEY_FILE
    keygen(key, f"hpcvm-cluster-{name}")
    return key.with_suffix(".pub").read_text(), key.read_text()
