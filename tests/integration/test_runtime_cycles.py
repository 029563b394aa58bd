"""20 up/exec/down cycles in a row, in this process, leave nothing behind: no QEMU, no
file descriptor of this process, no run dir or socket, no hugetlbfs file or huge page.

In-process (runtime/vm/lifecycle.py, not the CLI) so that a descriptor leaked by the
runtime — a QMP or agent socket, a log file, an event loop — shows up in this process's
/proc/self/fd. Takes a few minutes under TCG.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm import procs
from hpcvm.plan.model import PlanRequest
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.vm import guest_exec, lifecycle, stopping
from tests.runtime_support import Residue, assert_nothing_left, open_fds

pytestmark = pytest.mark.integration
CYCLES = 20
MIB = 1024 * 1024


def test_twenty_cycles_leave_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    request = PlanRequest(profile="naive", vcpus=1, memory_bytes=256 * MIB, accel="tcg")
    # One warm-up cycle first: imports and caches opened once (not leaks) settle there.
    stopping.down(lifecycle.up(request, lifecycle.UpOptions(name="warm")).name)
    before = Residue.take(root)
    fds = open_fds()
    pids: list[int] = []
    for i in range(CYCLES):
        machine = lifecycle.up(request, lifecycle.UpOptions(name=f"c{i}"))
        assert machine.pid is not None
        pids.append(machine.pid)
        result = guest_exec.exec_in(machine, ["cat", "/proc/sys/kernel/hostname"], timeout=60)
        assert result.exit_code == 0
        stopping.down(machine.name, timeout=30)
        assert not procs.pid_alive(machine.pid, reap=True)
    assert len(set(pids)) == CYCLES  # twenty distinct QEMUs really ran
    assert open_fds() - fds == set()  # none opened and left open (closing is no leak)
    assert_nothing_left(before)
