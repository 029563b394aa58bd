"""`hpcvm ps` and `hpcvm down` on VMs of hpcvm's own QEMU backend, read without
pydantic (runtime/vm/inventory.py, runtime/vm/stopping.py): a process standing in for
QEMU (tests/qemu_standin.py: its comm says qemu, it serves QMP) makes a running or a
paused VM without a guest. Oracles: the record as the models read it, the QEMU
backend's own answer over qemu.qmp, the stand-in's exit status (0 after a QMP quit,
-9 after a SIGKILL), the files left, and the modules a fresh `hpcvm` process imported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hpcvm.bootspec import Nic
from hpcvm.runtime.backends.qemu_backend import QemuBackend
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.record import read_record
from hpcvm.runtime.vm import inventory, stopping
from tests.qemu_standin import standin_machine, standin_qemu

# What listing and stopping a VM of hpcvm's QEMU backend must not import (issue 37).
MODELS = ("pydantic", "qemu", "asyncio")
HEAVY = (*MODELS, "rich", "numpy", "scipy", "matplotlib")
PROBE = """
import json, sys
from hpcvm.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "rt"))
    return paths.ensure_root()


def _run_dir(root: Path, name: str) -> Path:
    run_dir = root / name
    run_dir.mkdir(mode=0o700)
    return run_dir


def _hpcvm(root: Path, *argv: str) -> tuple[int, str, list[str]]:
    """``hpcvm ARGV`` in a fresh interpreter: its exit code, its output, its modules."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120,
        env={**os.environ, paths.ENV_RUNTIME_DIR: str(root)}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    *out, last = done.stdout.splitlines()
    said = json.loads(last)
    return said["code"], "\n".join(out), said["modules"]


def _loaded(modules: list[str], tops: tuple[str, ...]) -> list[str]:
    planner = [m for m in modules if m.startswith(("hpcvm.plan.", "hpcvm.host."))]
    planner = [m for m in planner if m not in ("hpcvm.plan.names", "hpcvm.host.privilege")]
    return sorted(m for m in modules if m.split(".")[0] in tops) + planner


@pytest.mark.parametrize("running", [True, False], ids=["running", "paused"])
def test_ps_lists_a_vm_of_the_qemu_backend_as_its_record_and_qemu_say(
    root: Path, running: bool
) -> None:
    run_dir = _run_dir(root, "vm1")
    with standin_qemu(run_dir / "qmp.sock", running=running) as qemu:
        machine = standin_machine(run_dir, qemu.pid)
        (row,) = inventory.list_vms()
        assert QemuBackend().status(machine) == row.state == ("running" if running else "paused")
        assert (row.name, row.backend, row.pid, row.profile, row.vcpus, row.memory_bytes) == (
            "vm1", "qemu", qemu.pid, machine.plan.profile, machine.plan.vcpus,
            machine.plan.memory_bytes,
        )  # fmt: skip
        assert row.uptime is not None and 0 <= row.uptime < 60 and row.note == ""
        code, out, modules = _hpcvm(root, "ps", "--json")
        (listed,) = json.loads(out)
        assert code == 0 and listed["state"] == row.state and listed["pid"] == qemu.pid
        assert _loaded(modules, HEAVY) == []
        assert "hpcvm.runtime.channels.qmp_line" in modules  # it did ask QEMU
        code, out, modules = _hpcvm(root, "ps")
        assert code == 0
        assert out.split("\n")[1].split()[:4] == ["vm1", "qemu", row.state, str(qemu.pid)]
        assert _loaded(modules, MODELS) == []  # rich draws the table


def test_ps_says_whose_orphan_a_vm_is(root: Path) -> None:
    run_dir = _run_dir(root, "vm1")
    with standin_qemu(run_dir / "qmp.sock") as qemu:
        # a pid above the kernel's largest (pid_max is at most 2**22): no process has it
        owner = state.Owner(pid=2**22 + 1, started=1.0, command="hpcvm bench")
        state.save_owner(run_dir, owner)
        standin_machine(run_dir, qemu.pid)
        (row,) = inventory.list_vms()
        assert row.state == "orphaned" and row.owner == "pid 4194305 (hpcvm bench)"
        assert row.note == "running; its owner pid 4194305 (hpcvm bench) is gone"
        (vm,) = inventory.running_vms(orphaned=True)
        assert vm.name == "vm1" and vm == read_record(run_dir)


def test_a_stale_record_is_cleaned_through_the_models_as_before(root: Path) -> None:
    run_dir = _run_dir(root, "dead")
    with standin_qemu(run_dir / "qmp.sock") as qemu:
        pid = qemu.pid
    standin_machine(run_dir, pid)
    (row,) = inventory.list_vms()
    assert (row.state, row.note) == ("stale", f"QEMU pid {pid} is gone; cleaned")
    assert row.uptime is None and not run_dir.exists()


def test_a_garbled_record_is_stale_and_cleaned_as_before(root: Path) -> None:
    run_dir = _run_dir(root, "garbled")
    (run_dir / paths.MACHINE_FILE).write_text('{"name": "garbled", "pid": ')
    (row,) = inventory.list_vms()
    assert (row.state, row.backend, row.note) == (
        "stale", "?", "no readable machine.json; cleaned"
    )  # fmt: skip
    assert not run_dir.exists()


def test_a_record_only_the_models_read_is_listed_through_them(root: Path) -> None:
    run_dir = _run_dir(root, "lax")
    with standin_qemu(run_dir / "qmp.sock", running=False) as qemu:
        standin_machine(run_dir, qemu.pid)
        path = run_dir / paths.MACHINE_FILE
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "pid": str(qemu.pid)}))  # pydantic's lax int
        assert read_record(run_dir) is None and state.read_machine(run_dir) is not None
        (row,) = inventory.list_vms()
        assert (row.state, row.pid) == ("paused", qemu.pid)
        _code, _out, modules = _hpcvm(root, "ps", "--json")
        assert "pydantic" in modules  # the models were asked, as they must be


def test_down_quits_qemu_over_qmp_and_removes_the_vm_without_the_models(root: Path) -> None:
    run_dir = _run_dir(root, "vm1")
    with standin_qemu(run_dir / "qmp.sock") as qemu:
        standin_machine(run_dir, qemu.pid)
        (run_dir / "agent.sock").write_text("")  # no agent answers: QMP quit ends it
        code, out, modules = _hpcvm(root, "down", "vm1")
        assert (code, out) == (0, "vm1: down")
        assert qemu.wait(timeout=30) == 0  # quit, not SIGKILL
    assert _loaded(modules, HEAVY) == []
    assert "hpcvm.runtime.channels.qmp_line" in modules
    assert not run_dir.exists()


def test_down_all_stops_every_vm_and_lists_the_stale_as_before(root: Path) -> None:
    dirs = [_run_dir(root, name) for name in ("a", "b")]
    with standin_qemu(dirs[0] / "qmp.sock") as a, standin_qemu(dirs[1] / "qmp.sock") as b:
        standin_machine(dirs[0], a.pid)
        standin_machine(dirs[1], b.pid)
        garbled = _run_dir(root, "c")
        (garbled / paths.MACHINE_FILE).write_text("{")
        code, out, modules = _hpcvm(root, "down", "--all")
        assert (code, out) == (0, "a: down\nb: down")
        assert (a.wait(timeout=30), b.wait(timeout=30)) == (0, 0)
    assert sorted(p.name for p in root.iterdir()) == []  # the garbled one cleaned as stale
    assert "pydantic" in modules  # for the garbled record only, as ps reads it


def test_a_vm_with_nics_or_of_another_backend_is_stopped_through_the_models(root: Path) -> None:
    run_dir = _run_dir(root, "vm1")
    nic = Nic(kind="bridge", source="br0", mac="52:54:00:00:00:01", ifname="hv1", mtu=1500)
    standin_machine(run_dir, 1, nics=(nic,))
    found = read_record(run_dir)
    assert found is not None and not stopping.stops_light(found)
    assert not stopping.stops_light(replace(found, nics=(), backend="libvirt"))
    assert stopping.stops_light(replace(found, nics=()))


def test_a_qemu_that_ignores_quit_is_killed_after_the_timeout(root: Path) -> None:
    """A stand-in that never answers QMP (stopped): quit times out, SIGKILL ends it.
    In another process, as `hpcvm down` runs: one that is QEMU's parent would reap it
    before the test could read how it ended."""
    run_dir = _run_dir(root, "deaf")
    with standin_qemu(run_dir / "qmp.sock") as qemu:
        standin_machine(run_dir, qemu.pid)
        os.kill(qemu.pid, signal.SIGSTOP)  # it answers nothing, but lives
        begin = time.monotonic()
        code, out, _modules = _hpcvm(root, "down", "--timeout", "1", "deaf")
        assert (code, out) == (0, "deaf: down")
        assert qemu.wait(timeout=30) == -signal.SIGKILL
        assert time.monotonic() - begin < 30
    assert not run_dir.exists()
