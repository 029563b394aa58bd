"""One writer per results directory (issue 17), with real processes.

A real ``hpcvm bench`` runs in the background (native, a plain command of about 1 s per
sample, so no VM is needed for the lock's behaviour); a second real process is started
against the same ``--out`` with and without ``--resume``, ``results`` reads it while it
runs, and then the first is killed with SIGKILL and resumed.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime_support import HPCVM, hpcvm, one_line_error

pytestmark = pytest.mark.integration

REPS = 8
BENCH = [
    "bench",
    "--env",
    "native",
    "--suite",
    "cmd",
    "--cmd",
    "sh -c 'sleep 1; echo value 7'",
    "--metric",
    "value ([0-9]+)",
    "--lower-is-better",
    "--reps",
    str(REPS),
]


def _samples(out: Path) -> list[tuple[int, int]]:
    """(run id, warm-up flag) of every sample; read straight from SQLite, not via hpcvm."""
    db = out / "hpcvm.db"
    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as con:
        try:
            return [(r[0], r[1]) for r in con.execute("SELECT run_id, warmup FROM samples")]
        except sqlite3.OperationalError:  # tables not made yet
            return []


def _runs(out: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(f"file:{out / 'hpcvm.db'}?mode=ro", uri=True, timeout=30) as con:
        return [(r[0], r[1]) for r in con.execute("SELECT id, status FROM runs")]


def _start(out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [HPCVM, *BENCH, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while len(_samples(out)) < 2:  # the warm-up and one measured sample are on disk
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first bench wrote no sample in 120 s"
        time.sleep(0.2)
    return proc


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    out = tmp_path / "r"
    proc = _start(out)
    yield proc, out
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


@pytest.mark.parametrize("resume", [False, True])
def test_second_writer_is_refused_before_it_starts_anything(
    running: tuple[subprocess.Popen[str], Path], resume: bool
) -> None:
    proc, out = running
    before = _samples(out)
    second = hpcvm(*BENCH, "--out", str(out), *(["--resume"] if resume else []))
    assert second.returncode == 8, second.stderr
    line = one_line_error(second)
    assert f"pid {proc.pid}" in line
    assert socket.gethostname() in line
    assert "started 20" in line  # an ISO date
    assert "--resume" in line and "wait" in line
    assert second.stdout == ""
    # the first writer goes on alone: still one run, one warm-up, nothing of the second
    after = _samples(out)
    assert after[: len(before)] == before
    assert [w for _, w in after].count(1) == 1
    assert {run for run, _ in after} == {1}
    assert proc.poll() is None


def test_results_reads_a_run_in_progress(running: tuple[subprocess.Popen[str], Path]) -> None:
    proc, out = running
    shown = hpcvm("results", str(out))
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert f"running (in progress: pid {proc.pid}" in text
    as_json = hpcvm("results", str(out), "--json")
    assert as_json.returncode == 0, as_json.stderr


def test_a_killed_writer_leaves_a_run_that_resumes_at_once(tmp_path: Path) -> None:
    out = tmp_path / "r"
    proc = _start(out)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert _runs(out) == [(1, "running")]  # what the killed writer left in the database

    shown = hpcvm("results", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "abandoned" in shown.stdout and "--resume" in " ".join(shown.stdout.split())

    resumed = hpcvm(*BENCH, "--out", str(out), "--resume", timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert _runs(out) == [(1, "finished")]
    measured = [s for s in _samples(out) if s[1] == 0]
    assert len(measured) == REPS


def test_a_refused_request_leaves_no_directory(tmp_path: Path) -> None:
    out = tmp_path / "never"
    refused = hpcvm("bench", "--env", "vm:nonesuch", "--suite", "noise", "--out", str(out))
    assert refused.returncode == 2, refused.stderr
    one_line_error(refused)
    assert not out.exists()
