"""hpcvm.timeline: marks are written only when asked, one line each, and a process's
start mark is its real start (bounded by the parent's clock around the spawn)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcvm import timeline

CHILD = (
    "from hpcvm import timeline\n"
    "timeline.mark_process_start('child: process start')\n"
    "timeline.mark('child: imported')\n"
)


def test_nothing_is_written_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(timeline.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    timeline.mark("nothing")
    timeline.mark_process_start("nothing")
    assert list(tmp_path.iterdir()) == []


def test_a_child_marks_its_start_and_its_marks_in_order(tmp_path: Path) -> None:
    out = tmp_path / "timeline.txt"
    before = time.time()
    subprocess.run(
        [sys.executable, "-c", CHILD], env={timeline.ENV: str(out)}, check=True, timeout=60
    )
    after = time.time()
    lines = [line.split(" ", 2) for line in out.read_text().splitlines()]
    assert [w for _, _, w in lines] == ["child: process start", "child: imported"]
    (start, pid, _), (imported, pid2, _) = lines
    assert pid == pid2 and int(pid) > 0
    tick = 0.02  # the kernel's start time is in 10 ms ticks
    assert before - tick <= float(start) <= float(imported) <= after
