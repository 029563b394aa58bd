"""A checkpoint directory on disk: written atomically, read back only when intact.

Writing: everything goes into a hidden sibling (``.DIR.partial-XXXX``) on the same file
system; each file is fsynced and hashed (SHA-256) as it is written; ``manifest.json``,
which lists every other file with its size and hash, is written last; then the
directory is renamed to ``DIR`` in one step and the parent fsynced. So ``DIR`` either
does not exist or is complete: a checkpoint that failed halfway (an error, a full disk,
a killed process) is at most a hidden ``.partial`` directory, never a ``DIR`` that
could be mistaken for a good one. A failure removes the partial directory itself; only
a process killed outright leaves one, which ``restore`` never reads.

A checkpoint holds the guest's RAM: its directory is 0700 (``mkdtemp``) and its files
0600, and it is made only where no other user can swap its files (paths.check_dir): in a
directory others may not write, or a sticky one such as /tmp, where nobody renames or
removes what another made. ``load`` reads only a checkpoint of this user's whose
directory nobody else may write, in such a directory: another user could otherwise
replace a file between its check and its use.

Reading (``load``): the manifest must parse and be of this schema version, every file
it lists must be there with its size and hash, and the plan must agree with the guest
ABI the manifest recorded. Anything else is refused in one line naming the file and
what is wrong with it, before anything is started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError

from hpcvm.errors import HpcvmError, UsageError
from hpcvm.model import first_complaint
from hpcvm.plan.model import VMPlan
from hpcvm.runtime.checkpoint.model import (
    CHECKPOINT_SCHEMA_VERSION,
    MANIFEST,
    PLAN_FILE,
    FileEntry,
    Manifest,
    abi_differences,
    guest_abi,
)
from hpcvm.runtime.hostside.paths import check_dir

CHUNK = 4 * 1024 * 1024
# A checkpoint's files are private to the user who saved it: another's cannot be read.
_READABLE_FIX = "give a checkpoint directory you may read (one you saved)"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory that passed every check of ``load``."""

    directory: Path
    manifest: Manifest
    plan: VMPlan  # as saved (the old host's host side; restore plans its own)

    def file(self, name: str) -> Path:
        return self.directory / name


# -- writing --------------------------------------------------------------------------


class Writer:
    """Files of a checkpoint being written, in its hidden partial directory."""

    def __init__(self, partial: Path) -> None:
        self.partial = partial
        self.files: dict[str, FileEntry] = {}

    def path(self, name: str) -> Path:
        """Where a file named ``name`` goes (for a writer outside hpcvm, e.g. QEMU)."""
        return self.partial / name

    def written(self, name: str) -> FileEntry:
        """Record a file something else wrote at ``path(name)``: fsync and hash it."""
        path = self.path(name)
        with path.open("rb") as fh:
            os.fchmod(fh.fileno(), 0o600)  # whatever its writer's umask gave it
            os.fsync(fh.fileno())
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        return self._record(name, FileEntry(size=path.stat().st_size, sha256=digest))

    def write_text(self, name: str, text: str) -> FileEntry:
        data = text.encode()
        with _private(self.path(name)) as fh:
            fh.write(data)
        return self._record(
            name, FileEntry(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        )

    def copy_in(self, name: str, source: Path) -> FileEntry:
        """Copy ``source`` in, hashing it on the way (one read)."""
        return self._record(name, copy_hashed(source, self.path(name)))

    def _record(self, name: str, entry: FileEntry) -> FileEntry:
        self.files[name] = entry
        return entry


@contextlib.contextmanager
def writing(target: Path) -> Iterator[Writer]:
    """A Writer for a checkpoint at ``target``; the caller commits with ``commit``.
    Whatever happens before the commit, the partial directory is removed."""
    target = check_target(target)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        yield Writer(partial)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already once committed


def commit(writer: Writer, manifest: Manifest, target: Path) -> Path:
    """Write the manifest (listing the writer's files) last, then move the directory
    into place at ``target`` in one rename; the target, absolute."""
    complete = manifest.model_copy(update={"files": dict(writer.files)})
    return commit_directory(writer.partial, MANIFEST, complete.model_dump_json(indent=2), target)


def commit_directory(partial: Path, manifest_name: str, manifest: str, target: Path) -> Path:
    """Write ``manifest`` (private, fsynced) into ``partial`` last, then move the
    directory into place at ``target`` in one rename (a job checkpoint too,
    cluster/commands/checkpoint.py); the target, absolute."""
    target = target.absolute()
    with _private(partial / manifest_name) as fh:
        fh.write(manifest.encode())
    fsync_dir(partial)
    try:
        os.rename(partial, target)
    except OSError as exc:
        raise UsageError(
            f"cannot put the checkpoint at {target} ({exc.strerror}): did another "
            "process create it meanwhile? give a new directory"
        ) from exc
    fsync_dir(target.parent)
    return target


def check_target(target: Path) -> Path:
    """The target, absolute, if it does not exist and its parent is a writable
    directory; a UsageError naming the problem otherwise (checked again at writing)."""
    target = target.absolute()
    if _lexists(target):
        raise UsageError(
            f"{target} already exists: give a new directory for the checkpoint (a "
            "checkpoint is never written over another)"
        )
    parent = target.parent
    if not parent.is_dir():
        raise UsageError(f"{parent} is not a directory: create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write in {parent}: give a directory you may write in")
    check_parent(parent)
    return target


def check_parent(parent: Path) -> None:
    """Refuse a directory where other users could rename or replace a checkpoint's
    files (writable by them and not sticky); links on the way are resolved first."""
    check_dir(
        parent.resolve(),
        "the checkpoint's directory",
        "other users could swap the checkpoint's files there (it holds the guest's RAM); "
        "give a directory only you may write, or a sticky one such as /tmp",
        owners="anyone",
        sticky_ok=True,
    )


def _lexists(path: Path) -> bool:
    """Whether anything, a dangling link too, is at ``path``; a UsageError where that
    cannot be told: a directory on the way this user may not enter (``Path.exists``
    raises PermissionError there on Python 3.11)."""
    try:
        path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise UsageError(
            f"{path} cannot be reached ({os.strerror(exc.errno or 0)}): give the checkpoint "
            "a new directory in one you may write"
        ) from None
    return True


@contextlib.contextmanager
def _private(path: Path) -> Iterator[BinaryIO]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())


def copy_hashed(source: Path, dest: Path) -> FileEntry:
    """Copy ``source`` to a new private file ``dest``, fsynced; its size and hash."""
    digest = hashlib.sha256()
    size = 0
    with source.open("rb") as src, _private(dest) as out:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return FileEntry(size=size, sha256=digest.hexdigest())


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading --------------------------------------------------------------------------


def load(directory: Path) -> Checkpoint:
    """The checkpoint at ``directory`` after every check; UsageError naming what is
    missing or damaged otherwise. Reads every file once (the hashes)."""
    directory = directory.absolute()
    problem = _not_a_readable_dir(directory)
    if problem is not None:
        raise UsageError(f"no checkpoint at {directory}: it {problem}")
    check_dir(
        directory.resolve(),
        "checkpoint",
        "hpcvm restores only a checkpoint of yours that no other user could change; "
        f"`chmod go-w {directory}` if it is yours",
    )
    check_parent(directory.resolve().parent)
    manifest = _manifest(directory)
    for name, entry in manifest.files.items():
        check_file(directory, name, entry)
    if PLAN_FILE not in manifest.files:
        raise UsageError(f"checkpoint {directory} is damaged: its manifest lists no {PLAN_FILE}")
    try:
        plan = VMPlan.model_validate_json((directory / PLAN_FILE).read_text())
    except (ValidationError, ValueError) as exc:
        raise _damaged(directory / PLAN_FILE, f"not a plan ({_first_error(exc)})") from None
    try:
        differences = abi_differences(manifest.abi, guest_abi(plan, manifest.boot))
    except HpcvmError as exc:  # a plan that does not even render
        raise _damaged(directory / PLAN_FILE, str(exc)) from None
    if differences:
        raise _damaged(
            directory / PLAN_FILE,
            f"it does not describe the VM that was saved ({'; '.join(differences)})",
        )
    return Checkpoint(directory=directory, manifest=manifest, plan=plan)


def _not_a_readable_dir(directory: Path) -> str | None:
    """Why ``directory`` cannot be read as a checkpoint's, or None. One stat: a path
    under a directory this user may not enter is said as such, not as a missing one
    (``Path.is_dir`` raises PermissionError there on Python 3.11)."""
    try:
        mode = directory.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "does not exist"
    except OSError as exc:
        return f"cannot be reached ({os.strerror(exc.errno or 0)}): {_READABLE_FIX}"
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    if not os.access(directory, os.R_OK | os.X_OK):
        return f"is not readable by you: {_READABLE_FIX}"
    return None


def _manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    if not path.is_file():
        partial = "" if directory.name.startswith(".") else " (or not a checkpoint at all)"
        raise UsageError(
            f"checkpoint {directory} is incomplete: it has no {MANIFEST}, which is written "
            f"last{partial}; give a checkpoint that `hpcvm checkpoint` completed"
        )
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise _unreadable(path, exc) from None
    try:
        raw = Manifest.model_validate_json(text)
    except (ValidationError, ValueError) as exc:
        version = _schema_version(path)
        if version is not None and version != CHECKPOINT_SCHEMA_VERSION:
            raise UsageError(
                f"checkpoint {directory} has schema version {version}; this hpcvm reads "
                f"version {CHECKPOINT_SCHEMA_VERSION}: restore it with the hpcvm that made it"
            ) from None
        raise _damaged(path, f"not a checkpoint manifest ({_first_error(exc)})") from None
    if raw.schema_version != CHECKPOINT_SCHEMA_VERSION:
        raise UsageError(
            f"checkpoint {directory} has schema version {raw.schema_version}; this hpcvm "
            f"reads version {CHECKPOINT_SCHEMA_VERSION}: restore it with the hpcvm that made it"
        )
    return raw


def _schema_version(path: Path) -> int | None:
    with contextlib.suppress(ValueError, OSError, AttributeError):
        value = json.loads(path.read_text()).get("schema_version")
        return value if isinstance(value, int) else None
    return None


def check_file(directory: Path, name: str, entry: FileEntry) -> None:
    """The file exists with the recorded size and SHA-256; UsageError otherwise."""
    path = directory / name
    if Path(name).name != name or name.startswith("."):
        raise _damaged(directory / "manifest.json", f"it lists a bad file name {name!r}")
    if not path.is_file():
        raise _damaged(path, "it is missing")
    size = path.stat().st_size
    if size != entry.size:
        hint = " (truncated)" if size < entry.size else ""
        raise _damaged(path, f"{size} bytes where {entry.size} were saved{hint}")
    try:
        with path.open("rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if digest != entry.sha256:
        raise _damaged(path, "its SHA-256 differs from the one recorded when it was saved")


def _unreadable(path: Path, exc: OSError) -> UsageError:
    """A checkpoint's file this user may not read: its files are private to the user
    who saved it (``_private``), so most likely it is someone else's checkpoint."""
    return UsageError(
        f"checkpoint {path.parent}: {path.name} cannot be read "
        f"({os.strerror(exc.errno or 0)}): {_READABLE_FIX}"
    )


def _damaged(path: Path, why: str) -> UsageError:
    return UsageError(
        f"checkpoint {path.parent} is damaged: {path.name}: {why}; nothing was started"
    )


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return first_complaint(exc).line(None)
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
