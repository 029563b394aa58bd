"""The QEMU backend (runtime/backends/qemu_backend.py) with the real QEMU under TCG, without a
guest: QEMU starts paused with no boot media, which is enough for QMP, vCPU threads,
pinning and stopping. Plans come from the real planner on this host."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.bootspec import BootSpec
from hpcvm.errors import RuntimeFailure
from hpcvm.host import discover
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest, ProfileName
from hpcvm.runtime.backends.qemu_backend import QemuBackend
from hpcvm.runtime.hostside import paths, pinning
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from tests.runtime_support import Residue, assert_nothing_left

pytestmark = pytest.mark.integration
MIB = 1024 * 1024


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    paths.ensure_root()
    before = Residue.take(root)
    yield root
    assert_nothing_left(before)


def _machine(root: Path, profile: ProfileName, vcpus: int, **boot: str) -> Machine:
    vm = plan(
        discover(),
        PlanRequest(name="b", profile=profile, vcpus=vcpus, memory_bytes=256 * MIB, accel="tcg"),
    )
    run_dir = root / "b"
    run_dir.mkdir(mode=0o700)
    return Machine(
        name="b",
        backend="qemu",
        run_dir=str(run_dir),
        pid=None,
        started_at=time.time(),
        plan=vm,
        boot=BootSpec(
            qmp_socket=str(run_dir / "qmp.sock"),
            agent_socket=str(run_dir / "agent.sock"),
            serial_log=str(run_dir / "console.log"),
            paused=True,
            **boot,
        ),
        image="none",
    )


def _cpus_allowed(pid: int, tid: int) -> str:
    text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return next(ln for ln in text.splitlines() if ln.startswith("Cpus_allowed_list"))


def test_start_pin_stop(runtime: Path) -> None:
    backend = QemuBackend()
    machine = backend.start(_machine(runtime, "pinned", 2))
    try:
        assert machine.pid is not None and state.is_qemu_process(machine.pid)
        for sock in ("qmp.sock", "agent.sock", "relay.sock"):  # relay: the agent's holder
            mode = os.stat(runtime / "b" / sock).st_mode
            assert stat.S_ISSOCK(mode) and mode & 0o777 == 0o600
        assert backend.status(machine) == "paused"
        threads = backend.vcpu_threads(machine)
        assert sorted(threads) == [0, 1]
        for index, tid in threads.items():
            name = Path(f"/proc/{machine.pid}/task/{tid}/comm").read_text().strip()
            assert name.startswith(f"CPU {index}/")
        pinning.pin(machine.plan, machine.pid, threads)
        for p in machine.plan.placements:
            assert _cpus_allowed(machine.pid, threads[p.vcpu]).split()[-1] == str(p.host_pu)
        backend.resume(machine)
        assert backend.status(machine) == "running"
    finally:
        backend.stop(machine, timeout=10.0)
    assert not backend.alive(machine)
    assert not (runtime / "b" / "qmp.sock").exists()
    state.remove_run_dir(runtime / "b")


def test_qemu_dying_at_start_reports_exit_code_and_log(runtime: Path, tmp_path: Path) -> None:
    bogus = tmp_path / "vmlinuz"
    bogus.write_bytes(b"this is not a kernel\n" * 100)
    backend = QemuBackend()
    with pytest.raises(RuntimeFailure) as err:
        backend.start(_machine(runtime, "naive", 1, kernel=str(bogus)))
    message = str(err.value)
    assert "exited with code 1" in message and "qemu.log" in message
    log = (runtime / "b" / "qemu.log").read_text().strip().splitlines()[-1]
    assert log.strip() in message  # the tail of QEMU's own log
    assert "\n" not in message
    state.remove_run_dir(runtime / "b")
