"""The test cluster's session registry (tests/cluster_support.py): the last live pytest
session takes down a cluster a session started, also after the starter was killed
before its teardown; a cluster started by hand stays up. Real processes, real /proc."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cluster_support as cs


@pytest.fixture
def other() -> Iterator[subprocess.Popen[bytes]]:
    """Another live process standing in for a second pytest session."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def entry_for(sessions: Path, pid: int) -> Path:
    start = cs.process_start(pid)
    assert start is not None
    entry = sessions / f"{pid}-{start}"
    entry.touch()
    return entry


def test_a_killed_sessions_entry_is_dropped_and_the_next_to_leave_takes_the_cluster_down(
    tmp_path: Path,
) -> None:
    sessions = tmp_path / "sessions"
    with cs.sessions_locked(sessions):
        mine = cs.register_session(sessions)
    (sessions / cs.STARTED_MARK).touch()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_entry = entry_for(sessions, dead.pid)
    dead.wait()
    assert cs.live_sessions(sessions) == [mine]
    assert not dead_entry.exists()
    assert cs.leave_session(mine)
    assert not (sessions / cs.STARTED_MARK).exists()  # said once


def test_a_live_session_keeps_the_cluster_up(
    tmp_path: Path, other: subprocess.Popen[bytes]
) -> None:
    sessions = tmp_path / "sessions"
    with cs.sessions_locked(sessions):
        mine = cs.register_session(sessions)
    (sessions / cs.STARTED_MARK).touch()
    entry_for(sessions, other.pid)
    assert not cs.leave_session(mine)
    assert (sessions / cs.STARTED_MARK).exists()  # kept for the last one to leave
    other.kill()
    other.wait()
    assert cs.live_sessions(sessions) == []


def test_a_reused_pid_is_not_the_session_that_registered(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / f"1-{int(cs.process_start(1) or 0) + 1}").touch()
    assert cs.live_sessions(sessions) == []


def test_a_cluster_started_by_hand_is_never_taken_down(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    with cs.sessions_locked(sessions):
        mine = cs.register_session(sessions)
    assert not cs.leave_session(mine)


def test_the_registry_goes_when_the_last_session_leaves(
    tmp_path: Path, other: subprocess.Popen[bytes]
) -> None:
    sessions = tmp_path / "sessions"
    with cs.sessions_locked(sessions):
        mine = cs.register_session(sessions)
    entry_for(sessions, other.pid)
    cs.leave_session(mine)
    cs.forget_sessions(sessions)
    assert sessions.exists()
    other.kill()
    other.wait()
    cs.forget_sessions(sessions)
    assert not sessions.exists()
