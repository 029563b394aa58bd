"""The holder's launcher and the end of a job: under Slurm's proctrack/cgroup the batch
system kills every process of the batch step moments after its SIGTERM, the holder
included, before the holder step has ended; so the SIGTERM itself must remove the
cluster's state directory (holder.py). A real holder process runs a stand-in step that
outlives the SIGTERM (as srun does while its tasks stop their VMs) and gets a real
SIGTERM, then SIGKILL as from the batch system; the oracle is the file system.
``cluster down`` marks the directory as its own first, and then the holder leaves it
alone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpcvm.cluster.batch.spawn import INTERNAL_MODULE
from hpcvm.cluster.job import state, state_files

# A step that outlives the SIGTERM (as srun waits for its tasks to stop their VMs); it
# touches its argument once it ignores the signal.
STUBBORN_STEP = (
    "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " pathlib.Path(sys.argv[1]).touch(); time.sleep(600)"
)


def start_holder(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The holder, and the pid of its step once the step runs and ignores SIGTERM (and
    so the holder, which set its handlers before starting it, is ready too)."""
    ready = directory.parent / f"{directory.name}.step-ready"
    step = [sys.executable, "-c", STUBBORN_STEP, str(ready)]
    argv = [sys.executable, "-m", INTERNAL_MODULE, "holder", str(directory), *step]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    assert wait_for(ready.exists), "the holder never started its step"
    ready.unlink()
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return proc, int(children[0])


def end(holder: subprocess.Popen[bytes], step: int) -> None:
    """What the batch system does next: SIGKILL to every process left."""
    for pid in (step, holder.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    holder.wait(timeout=30)


def wait_for(predicate: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + 30
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_sigterm_removes_the_clusters_state_while_the_step_still_runs(tmp_path: Path) -> None:
    directory = tmp_path / ".clusters" / "job7"
    directory.mkdir(parents=True)
    (directory / state.RECORD_FILE).write_text("{}")
    holder, step = start_holder(directory)
    try:
        holder.send_signal(signal.SIGTERM)
        # Gone, with the clusters' directory it was the last of, before the step ended.
        assert wait_for(lambda: not directory.parent.exists())
        assert holder.poll() is None
    finally:
        end(holder, step)


def test_a_cluster_being_taken_down_keeps_its_state_for_down(tmp_path: Path) -> None:
    directory = tmp_path / "job8"
    directory.mkdir()
    (directory / state.TAKING_DOWN).touch()
    holder, step = start_holder(directory)
    try:
        holder.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # a wrong holder would remove it within this
        assert (directory / state.TAKING_DOWN).exists()
    finally:
        end(holder, step)
    assert (directory / state.TAKING_DOWN).exists()


def _hpcvm(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCVM_RUNTIME_DIR": str(root)}
    code = "import sys; from hpcvm.cli.main import entry; sys.exit(entry())"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_a_step_that_ended_on_its_own_leaves_a_note_that_names_the_task(tmp_path: Path) -> None:
    """A node's task killed outright ends the step (srun says which task); the holder
    removes the state and leaves a note, so the batch script's later ``cluster wait``
    says why in one line with the lost-node exit status instead of "no cluster named";
    ``cluster ps`` (the job epilog runs it) says it once and removes it."""
    root = tmp_path / "rt"
    directory = root / ".clusters" / "job9"
    directory.mkdir(parents=True)
    (directory / state.RECORD_FILE).write_text("{}")
    said = "srun: error: node4: task 2: Killed"
    step = ["sh", "-c", f"echo 'srun: Job step aborted' >&2; echo '{said}' >&2; exit 9"]
    argv = [sys.executable, "-m", INTERNAL_MODULE, "holder", str(directory), *step]
    with (directory / state_files.LOG_FILE).open("ab") as log:
        holder = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=False)
    assert holder.returncode == 9
    assert not directory.exists()
    waited = _hpcvm(root, "cluster", "wait", "job9")
    assert waited.returncode == 11, waited.stderr
    (line,) = waited.stderr.strip().splitlines()
    assert "cluster job9 ended while its job ran" in line and said in line and "exit 9" in line
    listed = _hpcvm(root, "cluster", "ps")
    assert listed.returncode == 0 and said in listed.stderr, listed.stderr
    assert not (root / ".clusters" / "job9.ended").exists()
    assert "no cluster named" in _hpcvm(root, "cluster", "wait", "job9").stderr


def test_a_step_ended_by_the_jobs_sigterm_leaves_no_note(tmp_path: Path) -> None:
    directory = tmp_path / ".clusters" / "job10"
    directory.mkdir(parents=True)
    argv = [sys.executable, "-m", INTERNAL_MODULE, "holder", str(directory), "sleep", "600"]
    holder = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    assert wait_for(lambda: bool(Path(f"/proc/{holder.pid}/task/{holder.pid}/children")
                                 .read_text().split()))  # fmt: skip
    holder.send_signal(signal.SIGTERM)
    holder.wait(timeout=30)
    assert not directory.exists()
    assert not (tmp_path / ".clusters" / "job10.ended").exists()
