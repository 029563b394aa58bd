"""Machine records on disk, and telling a live VM from a stale record.

A record is ``<run_dir>/machine.json``. It is written atomically (temp file + rename) so
a reader never sees half a record, and as soon as QEMU has a pid, so that ``down`` can
clean up after an ``up`` that was interrupted. While ``up`` is starting a VM it holds an
exclusive ``flock`` on ``<run_dir>/up.lock``: other processes then see the VM as
"starting" instead of mistaking the half-built directory for a stale one.

A VM that lives only as long as the hpcvm process that started it (a ``bench``'s, a
``run``'s) has that process as its owner: ``<run_dir>/owner.json`` holds its pid and
start time, written with the first record (before QEMU starts) by a process that said
so (``owned_by_this_process``). When the owner dies without taking the VM down (it was
killed with SIGKILL) the VM is "orphaned" (``Entry.orphaned``); the start time keeps a
reused pid from passing for the owner. A VM of plain ``up`` has no owner: it is meant
to outlive the ``up``.

The module imports no pydantic: only ``read_machine`` (and what calls it) loads the
``Machine`` model. Telling a live VM from a stale one, its owner, listing the runtime
root and removing a run directory serve a record read with ``json`` alone as well
(runtime/machine/record.py ``VmRecord``: ``EntryOf`` is generic in the record), so that
``ps`` and ``down`` load the models only for a VM that needs them (issue 37).
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Literal, Protocol, TypeAlias, TypeVar

from hpcvm.errors import UsageError
from hpcvm.lock import is_held
from hpcvm.procs import pid_alive, process_start_time
from hpcvm.runtime.hostside import hugetlbfs, paths

if TYPE_CHECKING:  # loaded by read_machine only (module doc)
    from hpcvm.runtime.machine.model import Machine

EntryState = Literal["running", "paused", "starting", "stale"]

# A pid whose process started this long after the record's start time is a reused pid.
_PID_START_SLACK = 30.0
OWNER_FILE = "owner.json"
# /proc/stat's btime is computed from the clock and the uptime and may differ by a
# second between two reads; a reused pid starts later than that.
_OWNER_START_SLACK = 1.5


@dataclass(frozen=True)
class Owner:
    """The process a VM lives and dies with (``owner.json``)."""

    pid: int
    started: float  # its start time (process_start_time), which a reused pid lacks
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command})"

    def alive(self) -> bool:
        """Whether this very process still runs (not another one with its pid)."""
        if not pid_alive(self.pid, reap=True):
            return False
        started = process_start_time(self.pid)
        return started is not None and abs(started - self.started) <= _OWNER_START_SLACK


class Started(Protocol):
    """What telling a live VM from a stale record reads of it: a full ``Machine`` or a
    ``VmRecord`` (runtime/machine/record.py)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def started_at(self) -> float: ...


R = TypeVar("R", bound=Started)


@dataclass(frozen=True)
class EntryOf(Generic[R]):
    """One subdirectory of the runtime root, as ``ps`` sees it, with its record read
    as a ``Machine`` (``Entry``) or as a ``VmRecord``."""

    name: str
    run_dir: Path
    machine: R | None  # None when machine.json is missing or unreadable
    state: EntryState
    reason: str = ""  # why it is stale
    owner: Owner | None = None  # the process it lives with; None: it lives on its own

    @property
    def orphaned(self) -> bool:
        """Its QEMU runs but the process that owned it is gone."""
        return self.state == "running" and self.owner is not None and not self.owner.alive()


Entry: TypeAlias = "EntryOf[Machine]"


# The owner ``save_machine`` records for a VM made in this context (owned_by_this_process).
_OWNER: contextvars.ContextVar[Owner | None] = contextvars.ContextVar("vm_owner", default=None)


@contextlib.contextmanager
def owned_by_this_process(command: str) -> Iterator[None]:
    """VMs first recorded inside the block are this process's (``command`` says what it
    is, "hpcvm bench"): they are to end with it, and are shown "orphaned" should it die
    without taking them down. Set by the caller of ``lifecycle.up``, so that the owner
    is on disk before QEMU starts, not only once ``up`` returns."""
    me = Owner(
        pid=os.getpid(), started=process_start_time(os.getpid()) or time.time(), command=command
    )
    token = _OWNER.set(me)
    try:
        yield
    finally:
        _OWNER.reset(token)


def current_owner() -> Owner | None:
    """The owner a VM recorded now gets (``owned_by_this_process``), None outside it."""
    return _OWNER.get()


def save_owner(run_dir: Path, owner: Owner) -> None:
    """Write ``owner.json`` atomically, readable by the user only; a VM's first owner
    stays (a later save of its record does not change it)."""
    path = run_dir / OWNER_FILE
    if path.exists():
        return
    tmp = path.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(owner), fh)
    os.replace(tmp, path)


def read_owner(run_dir: Path) -> Owner | None:
    """The owner recorded in ``run_dir``; None when there is none (or it is unreadable)."""
    try:
        data = json.loads((run_dir / OWNER_FILE).read_text())
        return Owner(
            pid=int(data["pid"]), started=float(data["started"]), command=str(data["command"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_machine(machine: Machine) -> None:
    """Write the record atomically, readable by its owner only; inside
    ``owned_by_this_process`` the owner first."""
    if (owner := current_owner()) is not None:
        save_owner(Path(machine.run_dir), owner)
    target = Path(machine.run_dir) / paths.MACHINE_FILE
    tmp = target.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(machine.model_dump_json(indent=2))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)


def read_machine(run_dir: Path) -> Machine | None:
    """The record in ``run_dir``, or None when it is missing or unreadable (the models
    load only for a record there is)."""
    try:
        text = (run_dir / paths.MACHINE_FILE).read_text()
    except OSError:
        return None
    from pydantic import ValidationError

    from hpcvm.runtime.machine.model import Machine

    try:
        return Machine.model_validate_json(text)
    except ValidationError:
        return None


def load_machine(name: str) -> Machine:
    """The record of a VM the user named; one-line error if there is none."""
    directory = paths.run_dir(name)
    machine = read_machine(directory)
    if machine is None:
        raise UsageError(
            f"no VM named {name!r} (runtime dir {paths.runtime_root()}); `hpcvm ps` lists them"
        )
    return machine


# -- processes --------------------------------------------------------------------------


def is_qemu_process(pid: int) -> bool:
    """True when ``pid`` runs a QEMU system emulator."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm.startswith("qemu")


def machine_process_alive(machine: Started) -> tuple[bool, str]:
    """Whether the record's QEMU still runs; if not, why (for ``ps``)."""
    pid = machine.pid
    if pid is None:
        return False, "QEMU was never started"
    if not pid_alive(pid, reap=True):
        return False, f"QEMU pid {pid} is gone"
    if not is_qemu_process(pid):
        return False, f"pid {pid} is no longer QEMU"
    started = process_start_time(pid)
    if started is not None and started > machine.started_at + _PID_START_SLACK:
        return False, f"pid {pid} was reused by a newer process"
    return True, ""


# -- the up lock ------------------------------------------------------------------------


@contextlib.contextmanager
def starting_lock(run_dir: Path) -> Iterator[None]:
    """Hold the directory's up-lock while a VM is being started."""
    fd = os.open(run_dir / paths.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def is_starting(run_dir: Path) -> bool:
    """True while another process holds the up-lock of ``run_dir``."""
    return is_held(run_dir / paths.LOCK_FILE)


# -- listing and cleaning ---------------------------------------------------------------


def entry_for(run_dir: Path) -> Entry:
    """Classify one VM directory (running or stale; paused is the backend's to say)."""
    return classify(run_dir, read_machine(run_dir))


def classify(run_dir: Path, machine: R | None) -> EntryOf[R]:
    """``entry_for`` of a record already read (``machine``: None when there is none
    or it is unreadable), as a ``Machine`` or as a ``VmRecord``."""
    if is_starting(run_dir):
        return EntryOf(run_dir.name, run_dir, machine, "starting")
    if machine is None:
        return EntryOf(run_dir.name, run_dir, None, "stale", "no readable machine.json")
    alive, reason = machine_process_alive(machine)
    if alive:
        return EntryOf(run_dir.name, run_dir, machine, "running", owner=read_owner(run_dir))
    return EntryOf(run_dir.name, run_dir, machine, "stale", reason)


def list_entries() -> list[Entry]:
    """Every VM directory under the runtime root, sorted by name."""
    return [entry_for(d) for d in vm_dirs()]


def vm_dirs() -> list[Path]:
    """The VM directories under the runtime root, sorted by name."""
    root = paths.runtime_root()
    if not root.is_dir():
        return []
    # Hidden directories are ``up``'s half-made ones (see vm/run_dir.py, claimed_run_dir).
    return [d for d in sorted(root.iterdir()) if d.is_dir() and d.name[0] != "."]


def remove_run_dir(run_dir: Path, hugetlbfs_dirs: tuple[str, ...] = ()) -> None:
    """Remove a VM's directory and its private hugetlbfs directories (idempotent)."""
    for directory in hugetlbfs_dirs:
        hugetlbfs.remove_vm_dir(Path(directory))
    shutil.rmtree(run_dir, ignore_errors=True)


def keep_failed_logs(run_dir: Path, name: str) -> None:
    """Move a VM's logs (paths.KEPT_LOGS) out of its run directory into
    ``paths.kept_log``'s directory before the run directory goes, replacing an earlier
    failure's of the same name; keep the newest ``paths.KEPT_FAILURES`` such
    directories. Best effort: a failed ``up`` must still be torn down if this fails."""
    logs = [run_dir / log for log in paths.KEPT_LOGS if (run_dir / log).is_file()]
    if not logs:
        return
    kept = paths.kept_log(name, paths.CONSOLE_LOG).parent
    with contextlib.suppress(OSError):
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(mode=0o700, parents=True)
        for log in logs:
            shutil.move(log, kept / log.name)
        _prune_failed(kept.parent)


def _prune_failed(directory: Path) -> None:
    entries = sorted(
        (p for p in directory.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime
    )
    for old in entries[: -paths.KEPT_FAILURES]:
        shutil.rmtree(old, ignore_errors=True)


def clean_stale(entry: Entry) -> None:
    """Remove what a dead VM left behind."""
    dirs = entry.machine.hugetlbfs_dirs if entry.machine else ()
    remove_run_dir(entry.run_dir, dirs)


def uptime(machine: Started, now: float | None = None) -> float:
    return max(0.0, (now if now is not None else time.time()) - machine.started_at)
