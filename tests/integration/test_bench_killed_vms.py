"""A bench killed with SIGKILL cannot take its VMs down (issue 17): the resume of its run
does, before it starts its own, so no VM of the dead writer runs beside the resumed
measurement, holds its huge pages or outlives it. Real processes and a real TCG guest;
which QEMU runs is read from /proc, not from hpcvm."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.runtime_support import HPCVM, hpcvm

pytestmark = pytest.mark.integration

BENCH = [
    "bench", "--env", "native", "--env", "vm:naive", "--suite", "cmd",
    "--cmd", "sh -c 'sleep 1; echo value 7'", "--metric", "value ([0-9]+)",
    "--lower-is-better", "--reps", "3",
]  # fmt: skip


def _vm_samples(out: Path) -> int:
    db = out / "hpcvm.db"
    if not db.exists():
        return 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as con:
        try:
            row = con.execute(
                "SELECT count(*) FROM samples s JOIN environments e ON e.id = s.env_id "
                "WHERE e.name LIKE 'vm:%'"
            ).fetchone()
        except sqlite3.OperationalError:  # tables not made yet
            return 0
    return int(row[0])


def _qemus_under(runtime: Path) -> list[int]:
    """Live QEMU processes whose command line names a socket under ``runtime``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if (
            b"qemu-system" in argv[0]
            and state != "Z"
            and any(str(runtime).encode() in a for a in argv)
        ):
            found.append(int(entry.name))
    return found


def test_a_killed_writers_vms_are_taken_down_by_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guest: None
) -> None:
    runtime = tmp_path / "rt"
    monkeypatch.setenv("HPCVM_RUNTIME_DIR", str(runtime))
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [HPCVM, *BENCH, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while _vm_samples(out) < 1:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the bench wrote no VM sample in 600 s"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    orphans = _qemus_under(runtime)
    assert orphans  # what SIGKILL leaves: the killed writer's QEMU

    resumed = hpcvm(*BENCH, "--out", str(out), "--resume", timeout=900)
    assert resumed.returncode == 0, resumed.stderr
    assert f"left running by pid {proc.pid}" in resumed.stderr
    assert _qemus_under(runtime) == []
