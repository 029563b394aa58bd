"""Thread pinning and its read-back (runtime/hostside/pinning.py) on a real multi-threaded
process standing in for QEMU: a Python child whose threads play the vCPU threads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.hostside import pinning
from tests.runtime_support import tiny_plan

PUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(PUS) < 2, reason="needs 2 usable PUs")

_THREADS = """
import threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def proc() -> Iterator[subprocess.Popen[str]]:
    p = subprocess.Popen([sys.executable, "-c", _THREADS], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    yield p
    p.kill()
    p.wait()
    p.stdout.close()


def _allowed(pid: int, tid: int) -> set[int]:
    """Cpus_allowed_list from /proc (not sched_getaffinity, which the code uses)."""
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            out: set[int] = set()
            for part in line.split(":")[1].strip().split(","):
                lo, _, hi = part.partition("-")
                out.update(range(int(lo), int(hi or lo) + 1))
            return out
    raise AssertionError("no Cpus_allowed_list")


@needs_two
def test_pin_vcpus_and_emulator_threads(proc: subprocess.Popen[str]) -> None:
    tids = pinning.threads_of(proc.pid)
    assert len(tids) == 4
    vcpus = {0: tids[1], 1: tids[2]}
    plan = tiny_plan(vcpus=2, pus=(PUS[1], PUS[0]), emulator_pus=(PUS[0],))
    pinning.pin(plan, proc.pid, vcpus)
    assert _allowed(proc.pid, tids[1]) == {PUS[1]}
    assert _allowed(proc.pid, tids[2]) == {PUS[0]}
    assert _allowed(proc.pid, tids[0]) == {PUS[0]}  # main thread: emulator
    assert _allowed(proc.pid, tids[3]) == {PUS[0]}  # another non-vCPU thread


@needs_two
def test_unrestricted_emulator_threads_are_left_alone(proc: subprocess.Popen[str]) -> None:
    tids = pinning.threads_of(proc.pid)
    before = _allowed(proc.pid, tids[0])
    plan = tiny_plan(vcpus=1, pus=(PUS[1],))
    pinning.pin(plan, proc.pid, {0: tids[1]})
    assert _allowed(proc.pid, tids[1]) == {PUS[1]}
    assert _allowed(proc.pid, tids[0]) == before


@needs_two
def test_check_reports_a_pinning_that_was_undone(proc: subprocess.Popen[str]) -> None:
    tids = pinning.threads_of(proc.pid)
    plan = tiny_plan(vcpus=1, pus=(PUS[1],), emulator_pus=(PUS[0],))
    pinning.pin(plan, proc.pid, {0: tids[1]})
    subprocess.run(
        ["taskset", "-p", "-c", str(PUS[0]), str(tids[1])], check=True, capture_output=True
    )
    with pytest.raises(RuntimeFailure, match=r"vcpu0 \(tid \d+\) on PUs"):
        pinning.check(plan, proc.pid, {0: tids[1]})


def test_missing_vcpu_thread_is_an_error(proc: subprocess.Popen[str]) -> None:
    plan = tiny_plan(vcpus=1, pus=(PUS[0],))
    with pytest.raises(RuntimeFailure, match="no thread for vCPU 0"):
        pinning.pin(plan, proc.pid, {})


def test_unpinned_plan_changes_nothing(proc: subprocess.Popen[str]) -> None:
    tids = pinning.threads_of(proc.pid)
    before = {t: _allowed(proc.pid, t) for t in tids}
    pinning.pin(tiny_plan(vcpus=1), proc.pid, {0: tids[1]})
    assert {t: _allowed(proc.pid, t) for t in tids} == before


def test_threads_of_a_gone_process_is_empty() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    time.sleep(0.1)
    assert pinning.threads_of(p.pid) == []
