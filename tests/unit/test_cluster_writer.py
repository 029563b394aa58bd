"""One ``cluster up`` or ``down`` of a name at a time (issue 17's rule for every
command that writes shared state). A real second process holds the cluster's lock
through hpcvm.cluster.job.state itself; ``hpcvm cluster down`` of that name must be
refused at once, in one line naming the holder's pid, with BusyError's exit code, and
must leave the holder's state alone. No Slurm is needed: the refusal comes first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.cluster.job.state import ClusterRecord
from hpcvm.errors import BusyError

HOLD = """
import sys, time
from hpcvm.cluster.job import state
with state.one_writer("job7"):
    state.cluster_dir("job7").mkdir(parents=True)
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def runtime_dir(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    return root


@pytest.fixture
def holder(runtime_dir: Path) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "HPCVM_RUNTIME_DIR": str(runtime_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def _down(runtime_dir: Path) -> subprocess.CompletedProcess[str]:
    return _hpcvm(runtime_dir, "cluster", "down", "job7")


def _hpcvm(runtime_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCVM_RUNTIME_DIR": str(runtime_dir)}
    code = "import sys; from hpcvm.cli.main import entry; sys.exit(entry())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_down_while_another_process_writes_the_cluster_is_refused(
    runtime_dir: Path, holder: subprocess.Popen[str]
) -> None:
    done = _down(runtime_dir)
    assert done.returncode == BusyError.exit_code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"pid {holder.pid}" in lines[0] and "cluster 'job7'" in lines[0]
    assert (runtime_dir / ".clusters" / "job7").is_dir(), "the holder's state was touched"


def test_the_lock_dies_with_its_holder(runtime_dir: Path, holder: subprocess.Popen[str]) -> None:
    holder.kill()
    holder.wait()
    done = _down(runtime_dir)
    # no longer busy: down goes on and finds no cluster record (a usage error, not 8)
    assert done.returncode not in (0, BusyError.exit_code), done.stderr
    assert "in use by" not in done.stderr


def _record(runtime_dir: Path, name: str, holder_pid: int) -> None:
    directory = runtime_dir / ".clusters" / name
    directory.mkdir(parents=True)
    record = ClusterRecord(
        name=name, job_id="42", nodes=("n1", "n2"), holder_pid=holder_pid,
        network="10.0.0.0/24", vcpus=1,
    )  # fmt: skip
    (directory / "cluster.json").write_text(record.model_dump_json())


def test_cluster_ps_removes_only_the_state_nothing_runs(
    runtime_dir: Path, holder: subprocess.Popen[str]
) -> None:
    """A job killed outright leaves its state (the holder died first): ``cluster ps``
    without a name removes it; a cluster whose holder lives, and one whose ``up`` holds
    its lock (no record yet), stay."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    _record(runtime_dir, "gone", dead.pid)
    _record(runtime_dir, "alive", holder.pid)
    done = _hpcvm(runtime_dir, "cluster", "ps", "--json")
    assert done.returncode == 0, done.stderr
    listed = {row["name"]: row["state"] for row in json.loads(done.stdout)}
    assert listed == {"alive": "up", "job7": "starting"}, done.stdout
    assert "removed the state of cluster gone" in done.stderr
    left = sorted(p.name for p in (runtime_dir / ".clusters").iterdir())
    assert left == ["alive", "job7", "job7.lock"], left


def test_cluster_ps_shows_where_a_killed_move_left_the_vm(
    runtime_dir: Path, holder: subprocess.Popen[str]
) -> None:
    """A move whose source step died is settled by the VM's node task in one holder-log
    line; ``cluster migrate``'s failure points to ``cluster ps``, which shows it."""
    _record(runtime_dir, "alive", holder.pid)
    said = (
        "hpcvm: VM alive-n2 on n2: its migration to 10.0.0.3:4000 was killed (source step "
        "pid 77 gone) before the target was told to run it: resumed here"
    )
    log = runtime_dir / ".clusters" / "alive" / "holder.log"
    log.write_text(f"hpcvm: a disk image configures its own network\n{said}\n")
    done = _hpcvm(runtime_dir, "cluster", "ps", "alive")
    assert done.returncode == 0, done.stderr
    assert said in done.stdout and "configures its own" not in done.stdout, done.stdout


def test_cluster_wait_relays_a_killed_move_once_it_is_settled(
    runtime_dir: Path, holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cluster wait``'s watch (control.JobWatch) passes on each settling line that
    reaches the holder log while it waits, once; lines there before it began are ps's
    to show."""
    from hpcvm.cluster.commands.control import JobWatch

    monkeypatch.setenv("HPCVM_RUNTIME_DIR", str(runtime_dir))
    _record(runtime_dir, "alive", holder.pid)
    log = runtime_dir / ".clusters" / "alive" / "holder.log"
    old = "hpcvm: VM alive-n1 on n1: its migration to 10.0.0.3:4000 was killed (source step "
    log.write_text(f"{old}pid 70 gone) before the target was told to run it: resumed here\n")
    watch = JobWatch("alive")
    assert watch.lost() is None and watch.moves == []
    said = (
        "hpcvm: VM alive-n2 on n2: its migration to 10.0.0.3:4000 was killed (source step "
        "pid 77 gone) after the target was told to run it: taken down here"
    )
    with log.open("a") as out:
        out.write(f"hpcvm: a disk image configures its own network\n{said}\n")
    assert watch.lost() is None
    assert watch.moves == [said]
    watch.moves.clear()
    assert watch.lost() is None and watch.moves == []
