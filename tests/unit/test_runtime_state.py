"""Machine records and stale detection (runtime/machine/state.py), with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcvm import procs
from hpcvm.bootspec import BootSpec
from hpcvm.errors import UsageError
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from tests.runtime_support import tiny_plan


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "rt"))
    return paths.ensure_root()


def _machine(root: Path, name: str, pid: int | None, started_at: float | None = None) -> Machine:
    run_dir = root / name
    run_dir.mkdir(mode=0o700)
    return Machine(
        name=name,
        backend="qemu",
        run_dir=str(run_dir),
        pid=pid,
        started_at=time.time() if started_at is None else started_at,
        plan=tiny_plan(name),
        boot=BootSpec(qmp_socket=str(run_dir / "qmp.sock")),
        image="test",
    )


def test_save_and_load_round_trip(root: Path) -> None:
    machine = _machine(root, "job1", 12345)
    state.save_machine(machine)
    record = root / "job1" / paths.MACHINE_FILE
    assert record.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (root / "job1").iterdir()] == [paths.MACHINE_FILE]  # no temp file
    assert state.load_machine("job1") == machine


def test_load_unknown_name_is_one_line_usage_error(root: Path) -> None:
    with pytest.raises(UsageError) as err:
        state.load_machine("nope")
    assert "no VM named 'nope'" in str(err.value) and "\n" not in str(err.value)


def test_dead_pid_is_stale(root: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    state.save_machine(_machine(root, "dead", proc.pid))
    (entry,) = state.list_entries()
    assert entry.state == "stale" and "gone" in entry.reason


def test_live_process_that_is_not_qemu_is_stale(root: Path) -> None:
    with subprocess.Popen(["sleep", "30"]) as proc:
        try:
            state.save_machine(_machine(root, "reused", proc.pid))
            (entry,) = state.list_entries()
            assert entry.state == "stale" and "no longer QEMU" in entry.reason
        finally:
            proc.kill()


def test_unreaped_child_counts_as_dead(root: Path) -> None:
    """A zombie (our exited child not yet waited for) still has a /proc entry."""
    proc = subprocess.Popen(["true"])
    time.sleep(0.5)  # exits; not waited for
    assert not procs.pid_alive(proc.pid, reap=True)
    proc.wait()


def test_missing_record_is_stale_and_cleaned(root: Path) -> None:
    (root / "half").mkdir()
    (root / "half" / "qmp.sock").write_text("")
    (entry,) = state.list_entries()
    assert entry.state == "stale" and entry.machine is None
    state.clean_stale(entry)
    assert not (root / "half").exists()


def test_locked_dir_is_starting_not_stale(root: Path) -> None:
    (root / "busy").mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time;fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT);"
            "fcntl.flock(fd,fcntl.LOCK_EX);print('locked',flush=True);time.sleep(30)",
            str(root / "busy" / paths.LOCK_FILE),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        (entry,) = state.list_entries()
        assert entry.state == "starting"
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout:
            holder.stdout.close()
    (entry,) = state.list_entries()
    assert entry.state == "stale"


def test_hidden_dirs_are_not_listed(root: Path) -> None:
    (root / ".job1.abc").mkdir()
    assert state.list_entries() == []


def test_a_failed_ups_logs_are_kept_outside_ps_and_bounded(root: Path) -> None:
    """keep_failed_logs moves the two logs to where the error names them, replaces an
    earlier failure of the same name, keeps the newest KEPT_FAILURES, and `ps` (the
    runtime root's listing) never sees them as a VM."""
    names = [f"vm{i}" for i in range(paths.KEPT_FAILURES + 2)]
    for i, name in enumerate(names):
        run = root / name
        run.mkdir()
        (run / paths.CONSOLE_LOG).write_text(f"console of {name}\n")
        (run / paths.QEMU_LOG).write_text(f"qemu of {name}\n")
        (run / paths.QMP_SOCKET).write_text("")  # not a log: goes with the run dir
        state.keep_failed_logs(run, name)
        state.remove_run_dir(run)
        kept = paths.kept_log(name, paths.CONSOLE_LOG).parent
        os.utime(kept, (i, i))  # ages in the order of failure
    left = sorted(p.name for p in (root / paths.FAILED_DIR).iterdir())
    assert left == sorted(names[2:])
    for name in left:
        assert paths.kept_log(name, paths.CONSOLE_LOG).read_text() == f"console of {name}\n"
        assert sorted(p.name for p in paths.kept_log(name, "").iterdir()) == sorted(paths.KEPT_LOGS)
    assert state.list_entries() == []
    again = root / "vm9"
    again.mkdir()
    (again / paths.CONSOLE_LOG).write_text("second failure\n")
    state.keep_failed_logs(again, "vm9")
    assert paths.kept_log("vm9", paths.CONSOLE_LOG).read_text() == "second failure\n"
    assert not paths.kept_log("vm9", paths.QEMU_LOG).exists()  # only this failure's
