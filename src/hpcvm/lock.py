"""One writer at a time for anything hpcvm writes that two processes could share.

A results directory, a host's tuning state, a cluster job: each has a lock file that
its writer holds with an advisory ``flock`` for as long as it runs. The kernel drops
the lock when the holder's file is closed, so a writer killed with SIGKILL (or a power
loss) leaves no stale lock: the next writer gets it at once. The holder writes who it
is (pid, host, start time, command) into the file, so a refused process can say which
process to wait for or stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hpcvm.errors import BusyError

__all__ = ["BusyError", "Holder", "exclusive", "is_held", "read_holder"]

# A reader's ``is_held`` holds a shared lock on the file for the moment of its probe; a
# writer that meets one tries again for this long before it calls the file busy, so a
# reader never makes a writer refuse itself (naming the previous, perhaps dead, holder).
READER_GRACE_S = 0.5
_RETRY_S = 0.02
_OUTWAIT_POLL_S = 0.5


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as it wrote itself into the lock file."""

    pid: int
    host: str
    started: str
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started} ({self.command})"


def _me() -> Holder:
    now = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    command = " ".join(["hpcvm", *sys.argv[1:]]) if sys.argv else "hpcvm"
    return Holder(pid=os.getpid(), host=socket.gethostname(), started=now, command=command)


def read_holder(path: Path) -> Holder | None:
    """The holder recorded in ``path``; None when the file is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
        return Holder(
            pid=int(data["pid"]),
            host=str(data["host"]),
            started=str(data["started"]),
            command=str(data["command"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_held(path: Path) -> bool:
    """Whether a live process holds the lock in ``path`` now (readers use this to mark
    what they show as in progress)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def exclusive(
    path: Path,
    what: str,
    advice: str,
    *,
    remove: bool = False,
    label: str | None = None,
    outwait: Callable[[Holder], bool] | None = None,
    patience: float = 0.0,
) -> Iterator[Holder]:
    """Hold the lock in ``path`` for the block, or raise BusyError at once.

    ``label`` is what the lock file says this holder does (the command line when None).
    A holder for which ``outwait(holder)`` is true is waited for, up to ``patience``
    seconds, instead of refused at once: work that ends by itself (a periodic
    checkpoint) delays the next writer rather than failing it.

    ``what`` names the thing written ("results directory r/"), ``advice`` what the
    refused user should do ("wait for it, or stop it and run again with --resume").
    The lock taken is always on the file at ``path`` now: a writer that opened a file
    another writer removed before it could lock it opens the path again. So a holder may
    remove the file while it still holds it (``remove``, for things that come and go,
    like a cluster job, whose lock files would otherwise pile up); a holder of a lasting
    thing leaves it in place.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + patience
    while True:
        try:
            fd = _open_locked(path, what, advice)
            break
        except BusyError:
            holder = read_holder(path)
            if outwait is None or holder is None or not outwait(holder):
                raise
            if time.monotonic() >= deadline:
                raise
            time.sleep(_OUTWAIT_POLL_S)
    try:
        me = _me() if label is None else dataclasses.replace(_me(), command=label)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me.__dict__).encode() + b"\n", 0)
        yield me
    finally:
        if remove:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # still held: whoever opens the path next makes a new file
        os.close(fd)  # closing the only descriptor releases the flock


def _open_locked(path: Path, what: str, advice: str) -> int:
    """A descriptor of the file at ``path``, exclusively locked; BusyError when a live
    writer holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if not _lock_soon(fd):
                holder = read_holder(path)
                who = holder.describe() if holder else "another process"
                raise BusyError(f"{what} is in use by {who}: {advice}")
            if _is_at(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # locked a file its holder removed meanwhile: take the new one


def _is_at(fd: int, path: Path) -> bool:
    """Whether ``fd`` is the file at ``path`` now (not one removed since it was opened)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (here.st_dev, here.st_ino)


def _lock_soon(fd: int) -> bool:
    """Take the exclusive lock, waiting at most ``READER_GRACE_S`` for readers' probes
    (a writer holds it far longer); False if it is still taken then."""
    deadline = time.monotonic() + READER_GRACE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_RETRY_S)
        else:
            return True
