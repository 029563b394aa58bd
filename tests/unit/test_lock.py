"""hpcvm.lock with real processes: a holder in another process refuses us with its
identity; the lock is gone the moment the holder dies, even by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from hpcvm.errors import BusyError
from hpcvm.lock import exclusive, is_held, read_holder

HOLD = """
import sys, time
from pathlib import Path
from hpcvm.lock import exclusive
with exclusive(Path(sys.argv[1]), "thing", "wait"):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_refused_while_another_process_holds_it(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    proc = _holder(lock)
    try:
        assert is_held(lock)
        holder = read_holder(lock)
        assert holder is not None and holder.pid == proc.pid
        with pytest.raises(BusyError) as caught, exclusive(lock, "the thing", "wait for it"):
            pass
        assert f"pid {proc.pid}" in str(caught.value)
        assert str(caught.value).endswith(": wait for it")
        assert caught.value.exit_code == 8
    finally:
        proc.kill()
        proc.wait()


def test_sigkill_of_the_holder_frees_it_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    proc = _holder(lock)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not is_held(lock)
    with exclusive(lock, "the thing", "wait") as me:
        assert me.pid == os.getpid()
        assert is_held(lock)  # a second descriptor, even in this process, is refused
        assert read_holder(lock) == me
    assert not is_held(lock)


def test_not_held_when_missing(tmp_path: Path) -> None:
    assert not is_held(tmp_path / "none.lock")
    assert read_holder(tmp_path / "none.lock") is None


PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # what is_held takes for its probe
print("probing", flush=True)
sys.stdin.readline()
"""


def test_a_readers_probe_does_not_refuse_a_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader (``results`` asking is_held) holds a shared lock for the moment of its
    probe; a writer starting in that moment waits for it instead of calling the
    directory busy. The probe is held here until the writer is already trying; the
    grace is made long so that the outcome does not depend on timing; the writer is
    seen waiting before the probe ends."""
    lock = tmp_path / "x.lock"
    lock.touch()
    reader = subprocess.Popen(
        [sys.executable, "-c", PROBE, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None and reader.stdin is not None
    assert reader.stdout.readline().strip() == "probing"
    monkeypatch.setattr("hpcvm.lock.READER_GRACE_S", 600.0)
    waited = threading.Event()  # set when the writer found the file locked and waits

    def sleep(seconds: float) -> None:
        waited.set()
        time.sleep(seconds)

    monkeypatch.setattr(
        "hpcvm.lock.time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep)
    )
    got: list[object] = []

    def write() -> None:
        try:
            with exclusive(lock, "the thing", "wait") as me:
                got.append(me)
        except BusyError as exc:
            got.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    while not waited.is_set() and writer.is_alive():  # the writer has met the probe
        waited.wait(0.05)
    reader.stdin.write("done\n")
    reader.stdin.flush()
    reader.wait()
    writer.join()
    assert len(got) == 1 and not isinstance(got[0], BusyError), got


def test_a_removed_lock_file_is_never_left_behind(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with exclusive(lock, "thing", "wait", remove=True):
        assert is_held(lock)
    assert not lock.exists()


def test_a_writer_that_opened_a_since_removed_file_locks_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between our open and our flock another writer takes the lock, finishes and
    removes the file: the lock we then get is on a file nobody else will ever open.
    ``exclusive`` must notice and lock the file that is at the path now."""
    import hpcvm.lock as lock_module

    lock = tmp_path / "x.lock"
    real = lock_module._lock_soon
    raced: list[int] = []

    def racing(fd: int) -> bool:
        if not raced:
            raced.append(fd)
            with exclusive(lock, "thing", "wait", remove=True):  # the other writer
                pass
        return real(fd)

    monkeypatch.setattr(lock_module, "_lock_soon", racing)
    with exclusive(lock, "thing", "wait", remove=True):
        assert raced and lock.exists() and is_held(lock)  # held, and at the path
    assert not lock.exists()
