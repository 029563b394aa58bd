"""A migration's source step that died (cluster/tasks/moved.py): its ``moving`` marker is
told apart from a live step's by the real process (pid and start time), and a step
killed after the target was told to run the VM leaves it paused, said in one line.
(Resuming a VM paused before "go" is tested with a real migration killed midway on the
Slurm test cluster: tests/integration/test_cluster_migrate.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcvm import procs
from hpcvm.bootspec import BootSpec
from hpcvm.cluster.tasks import moved
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine.model import Machine
from tests.runtime_support import tiny_plan


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "rt"))
    run_dir = paths.ensure_root() / "vm1"
    run_dir.mkdir(mode=0o700)
    return Machine(
        name="vm1",
        backend="qemu",
        run_dir=str(run_dir),
        pid=None,
        started_at=time.time(),
        plan=tiny_plan("vm1"),
        boot=BootSpec(qmp_socket=str(run_dir / "qmp.sock")),
        image="test",
    )


def _dead_pid() -> tuple[int, float]:
    """A process that ran and was reaped: its pid and start time."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = procs.process_start_time(proc.pid)
    assert started is not None
    proc.kill()
    proc.wait()
    return proc.pid, started


def _moving(pid: int, started: float, phase: moved.Phase) -> moved.Moving:
    return moved.Moving(pid=pid, started=started, node="node2", target="10.0.0.3:4000", phase=phase)


def test_a_live_step_is_left_alone(machine: Machine) -> None:
    me = os.getpid()
    started = procs.process_start_time(me)
    assert started is not None
    moved.write_moving(machine.name, _moving(me, started, "paused"))
    said: list[str] = []
    assert moved.settle_abandoned(machine, said.append) is None and said == []
    assert moved.step_alive(_moving(me, started, "paused"))
    assert not moved.step_alive(_moving(me, started - 100, "paused"))  # a reused pid


def test_a_step_killed_after_go_leaves_the_vm_paused_and_says_so(
    machine: Machine, capsys: pytest.CaptureFixture[str]
) -> None:
    pid, started = _dead_pid()
    moved.write_moving(machine.name, _moving(pid, started, "go"))
    assert not moved.migrated_away(machine)  # the node task's question settles it
    err = capsys.readouterr().err
    assert err.startswith("hpcvm: VM vm1 on node2: its migration to 10.0.0.3:4000 was killed")
    assert f"pid {pid} gone" in err and "stays paused here" in err and err.count("\n") == 1
    assert not moved.moving_path(machine.name).exists()
    assert not moved.migrated_away(machine)
    assert capsys.readouterr().err == ""  # said once, not twice a second


def test_how_far_a_dead_move_got_is_read_from_its_own_marker(machine: Machine) -> None:
    """``cluster migrate``'s first question to the source node (migrate_node.run_settle):
    the phase in this move's marker, still there or settled by the node's task; an
    earlier move's settled marker is not this one's ("": it left none)."""
    from hpcvm.cluster.tasks import migrate_node

    pid, started = _dead_pid()
    earlier = _moving(pid, started, "paused").model_copy(update={"move": "m0"})
    moved.write_moving(machine.name, earlier)
    os.replace(moved.moving_path(machine.name), moved.settled_path(machine.name))
    assert migrate_node._phase_reached(machine.name, "m1") == ""
    assert migrate_node._phase_reached(machine.name, "m0") == "paused"
    moved.write_moving(
        machine.name, _moving(pid, started, "told").model_copy(update={"move": "m1"})
    )
    assert migrate_node._phase_reached(machine.name, "m1") == "told"
