"""What a process that is not root meets, run for real: a child forked from the test
(root) drops to another user (setgroups, setgid, setuid) and runs a function there; its
answer comes back over a pipe. Root passes every permission check, so this is how tests
see what a site's user sees, without simulating it. Also a directory both can reach."""

from __future__ import annotations

import contextlib
import os
import pickle
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from hpcvm.errors import HpcvmError, UsageError


class Raised(NamedTuple):
    """An exception the child's function raised, as plain data."""

    name: str  # the class's name
    exit_code: int | None  # an HpcvmError's exit code; None for any other exception
    message: str
    usage: bool  # a UsageError (or a subclass)


def in_child_as(uid: int, gid: int, work: Callable[[], Any]) -> Any:
    """``work()`` in a forked child running as ``uid``/``gid`` with no supplementary
    groups: what it returned, or a :class:`Raised` for what it raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        try:
            _drop_to(uid, gid)
            try:
                answer: Any = work()
            except BaseException as exc:  # handed to the test, which judges it
                code = exc.exit_code if isinstance(exc, HpcvmError) else None
                answer = Raised(type(exc).__name__, code, str(exc), isinstance(exc, UsageError))
            os.write(write, pickle.dumps(answer))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def _drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


@contextlib.contextmanager
def process_as(uid: int, gid: int, work: Callable[[], Any] = lambda: None) -> Iterator[int]:
    """A live process running as ``uid``/``gid`` for the block: forked, dropped to that
    user, ``work()`` run in it (e.g. claiming something), then it waits until the block
    ends and it is killed. Yields its pid once ``work`` has returned."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        try:
            _drop_to(uid, gid)
            kept = work()  # noqa: F841  (held, e.g. a claim, until the process ends)
            os.write(write, b"ready")
            while True:
                signal.pause()
        finally:
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read(5)
    try:
        assert said == b"ready", f"the process as uid {uid} failed before it was ready"
        yield pid
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory (0755, in /var/tmp) that another user can reach: pytest's tmp_path
    lies under root's private /tmp/pytest-of-root."""
    path = Path(tempfile.mkdtemp(prefix="hpcvm-test-user-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def remove_user(name: str) -> None:
    """Remove a user a test made, with its home and the per-user runtime directory its
    hpcvm commands made (``/tmp/hpcvm-UID``, which userdel does not know of)."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return
    subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)
    shutil.rmtree(Path(tempfile.gettempdir()) / f"hpcvm-{uid}", ignore_errors=True)
