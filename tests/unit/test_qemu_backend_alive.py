"""Whether a QEMU the backend started still runs, asked through its own ``Popen``
(runtime/backends/qemu_backend.py): asking /proc and reaping the pid behind Popen's back
left Popen an exit status of 0, and ``death_message`` then said "exited with code 0"
for a QEMU that crashed while booting. A real child process stands in for QEMU (its
exit code is the oracle)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from hpcvm.bootspec import BootSpec
from hpcvm.runtime.backends.qemu_backend import QemuBackend
from hpcvm.runtime.machine.model import Machine
from tests.runtime_support import tiny_plan


def _machine(tmp_path: Path, pid: int) -> Machine:
    return Machine(
        name="crash", backend="qemu", run_dir=str(tmp_path), pid=pid, started_at=time.time(),
        plan=tiny_plan("crash"), boot=BootSpec(), image="test",
    )  # fmt: skip


def test_a_crashed_child_is_gone_and_keeps_its_exit_code(tmp_path: Path) -> None:
    backend = QemuBackend()
    proc = subprocess.Popen(["sh", "-c", "sleep 0.2; exit 3"])
    backend._children[proc.pid] = proc  # as start() records the QEMU it started
    machine = _machine(tmp_path, proc.pid)
    assert backend.alive(machine)
    deadline = time.monotonic() + 30
    while backend.alive(machine):
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)
    assert backend.exit_code(machine) == 3
    assert "exited with code 3" in backend.death_message(machine)


def test_a_qemu_of_another_process_is_asked_of_proc(tmp_path: Path) -> None:
    backend = QemuBackend()
    proc = subprocess.Popen(["sleep", "30"])
    try:
        # not QEMU (comm is sleep): /proc says it is no VM's QEMU
        assert not backend.alive(_machine(tmp_path, proc.pid))
    finally:
        proc.kill()
        proc.wait()
