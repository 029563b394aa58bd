"""A VM's owner (runtime/machine/state.py ``Owner``) counts as alive only while that very
process runs: a process that exited, or another one the kernel gave its pid since (a
different start time), is not it. Real processes, read from /proc."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hpcvm import procs
from hpcvm.runtime.machine import state


def test_the_owner_is_this_process_and_not_a_reused_pid() -> None:
    with state.owned_by_this_process("hpcvm test"):
        me = state.current_owner()
    assert state.current_owner() is None  # only inside the block
    assert me is not None and me.pid == os.getpid() and me.alive()
    started = procs.process_start_time(os.getpid())
    assert started is not None
    reused = state.Owner(pid=os.getpid(), started=started - 3600, command="hpcvm bench")
    assert not reused.alive()  # same pid, another process's start time


def test_an_exited_owner_is_gone() -> None:
    child = subprocess.Popen(["sleep", "30"])
    started = procs.process_start_time(child.pid)
    assert started is not None
    owner = state.Owner(pid=child.pid, started=started, command="hpcvm run")
    assert owner.alive()
    child.kill()
    child.wait()
    assert not owner.alive()


def test_the_owner_file_round_trips_and_a_bad_one_is_no_owner(tmp_path: Path) -> None:
    assert state.read_owner(tmp_path) is None
    (tmp_path / state.OWNER_FILE).write_text("{not json")
    assert state.read_owner(tmp_path) is None
    (tmp_path / state.OWNER_FILE).unlink()
    owner = state.Owner(pid=123, started=1.5, command="hpcvm bench")
    state.save_owner(tmp_path, owner)
    assert state.read_owner(tmp_path) == owner
    assert (tmp_path / state.OWNER_FILE).stat().st_mode & 0o777 == 0o600
