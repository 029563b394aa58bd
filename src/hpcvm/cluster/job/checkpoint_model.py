"""What a whole job's checkpoint directory holds, and how it is read back.

``cluster checkpoint NAME DIR`` writes (cluster/commands/checkpoint.py)::

    DIR/job.json          the JobManifest below, written last
    DIR/id_job, .pub      the job's ssh key pair (the guests hold its public half, the
                          first VM its private half: a restored job must keep it)
    DIR/vm-0/ ... vm-N/   one VM checkpoint per node, in the job's node order
                          (runtime/checkpoint/directory.py: each checks its own files)

Like one VM's checkpoint it is written into a hidden sibling and renamed in one step:
``DIR`` either does not exist or is complete. The manifest records the SHA-256 of the
key files; each VM directory has its own manifest with its files' checksums, which the
node that restores it checks before its QEMU starts.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from pydantic import ValidationError

from hpcvm.cluster.job.spec import ClusterSpec
from hpcvm.errors import UsageError
from hpcvm.model import Frozen

MANIFEST = "job.json"
KEY_FILE = "id_job"
SCHEMA = 1
# Every caller's directory is `cluster up --restore`'s; a job checkpoint's files are
# private to the user who saved it, so another user's cannot be restored.
_READABLE_FIX = "give --restore a job checkpoint you may read (one you saved)"


def vm_dir_name(index: int) -> str:
    return f"vm-{index}"


class SavedVm(Frozen):
    """One node's VM as it was saved: where it ran, its name (its MAC follows it) and
    its guest address (kept in the guest's memory, so a restore keeps it)."""

    index: int
    node: str
    vm: str
    address: str


class PeriodicCheckpoints(Frozen):
    """``cluster up --checkpoint-every``: the job saves itself every ``every`` seconds
    into a new directory of the series ``directory`` (cluster/commands/keeper.py), keeping
    the newest ``keep`` complete ones."""

    every: float
    directory: str
    keep: int = 1


class DetachedExec(Frozen):
    """A command ``cluster exec --detach`` started in the first VM: its guest pid,
    whose output and exit status qemu-ga keeps in the guest until ``cluster wait``
    collects them."""

    pid: int
    argv: tuple[str, ...]
    started_at: float


class JobManifest(Frozen):
    """A whole job's checkpoint (module doc)."""

    schema_version: int = SCHEMA
    name: str  # the cluster's name when saved
    job_id: str  # the batch job it was saved from
    saved_at: float
    spec: ClusterSpec  # the request every node planned (restores plan it again)
    network: str  # the VMs' network
    vcpus: int
    vms: tuple[SavedVm, ...]
    detached: tuple[DetachedExec, ...] = ()
    key_sha256: dict[str, str]  # file name -> SHA-256 (the job's key pair)
    pause_seconds: float  # from the start of the pause step to the end of the save step


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read(directory: Path) -> JobManifest:
    """The manifest of the job checkpoint at ``directory``, with its key files checked;
    UsageError in one line for a directory that is not one, incomplete or damaged (each
    VM's own files are checked by the node that restores it)."""
    path = directory / MANIFEST
    _check_dir(directory)
    if not path.is_file():
        raise UsageError(
            f"{directory} is not a complete job checkpoint (no {MANIFEST}): it was not "
            "written by hpcvm cluster checkpoint, or that checkpoint did not finish"
        )
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise _unreadable(path, exc) from None
    try:
        manifest = JobManifest.model_validate_json(text)
    except (ValidationError, ValueError) as exc:
        raise UsageError(f"{path} is damaged ({str(exc).splitlines()[0]})") from None
    if manifest.schema_version != SCHEMA:
        raise UsageError(
            f"{path} has schema version {manifest.schema_version}; this hpcvm reads {SCHEMA}"
        )
    for name, digest in manifest.key_sha256.items():
        key = directory / name
        if not key.is_file() or _sha256_or_refuse(key) != digest:
            raise UsageError(f"job checkpoint {directory} is damaged: {name} is missing or changed")
    for vm in manifest.vms:
        if not (directory / vm_dir_name(vm.index)).is_dir():
            raise UsageError(
                f"job checkpoint {directory} is incomplete: {vm_dir_name(vm.index)} "
                f"(the VM of node {vm.node}) is missing"
            )
    return manifest


def _check_dir(directory: Path) -> None:
    """``directory`` must be a directory this user may read. One stat: a path under a
    directory this user may not enter is said as such, not as a missing one
    (``Path.is_dir`` raises PermissionError there on Python 3.11)."""
    try:
        mode = directory.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(
            f"{directory} is not a job checkpoint (no such directory): give the directory "
            "hpcvm cluster checkpoint wrote"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"job checkpoint {directory} cannot be reached ({os.strerror(exc.errno or 0)}): "
            f"{_READABLE_FIX}"
        ) from None
    if not stat.S_ISDIR(mode):
        raise UsageError(
            f"{directory} is not a job checkpoint (not a directory): give the directory "
            "hpcvm cluster checkpoint wrote"
        )
    if not os.access(directory, os.R_OK | os.X_OK):
        raise UsageError(f"job checkpoint {directory} is not readable by you: {_READABLE_FIX}")


def _sha256_or_refuse(path: Path) -> str:
    try:
        return sha256_of(path)
    except OSError as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: OSError) -> UsageError:
    """A job checkpoint's file this user may not read (its key pair and manifests are
    private to the user who saved it: most likely it is someone else's)."""
    return UsageError(
        f"job checkpoint {path.parent}: {path.name} cannot be read "
        f"({os.strerror(exc.errno or 0)}): {_READABLE_FIX}"
    )
