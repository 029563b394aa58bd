"""One ``cluster up`` or ``down`` of a name at a time (issue 17's rule for every
command that writes shared state). A real second process holds the cluster's lock
through hpcvm.cluster.state itself; ``hpcvm cluster down`` of that name must be
refused at once, in one line naming the holder's pid, with BusyError's exit code, and
must leave the holder's state alone. No Slurm is needed: the refusal comes first."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.errors import BusyError

HOLD = """
import sys, time
from hpcvm.cluster import state
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
    env = {**os.environ, "HPCVM_RUNTIME_DIR": str(runtime_dir)}
    code = "import sys; from hpcvm.cli.main import entry; sys.exit(entry())"
    return subprocess.run(
        [sys.executable, "-c", code, "cluster", "down", "job7"],
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
