"""hpcvm.lock with real processes: a holder in another process refuses us with its
identity; the lock is gone the moment the holder dies, even by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
