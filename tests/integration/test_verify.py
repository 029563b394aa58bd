"""`hpcvm verify` on real VMs: it passes on a correct VM and fails, exit 6, naming
exactly what is wrong, when the running VM no longer matches its plan.

The faults are made from outside, the way they happen: a vCPU thread re-pinned behind
hpcvm's back (os.sched_setaffinity for the QEMU backend; libvirt's live vcpupin for the
libvirt backend, whose cgroup cpuset would refuse a bare sched_setaffinity), and a
machine record whose plan no longer describes the VM. vCPU thread ids come from QEMU's
thread names in /proc, not from the code under test.

The record-mismatch tests and the dead-VM test share one booted QEMU VM (module scope,
``shared``): the first two change only the machine record and put it back (and check
that verify passes again, which shows the VM is as it was); the dead-VM test, last in
the file, kills it. ``shared`` boots it again if a test before found it dead (a run of
selected tests in another order). The swapped-pins tests boot their own: they re-pin
the VM's threads.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import libvirt
import pytest

from hpcvm import procs
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from tests.runtime_support import Residue, assert_nothing_left, hpcvm

pytestmark = pytest.mark.integration

PAGE_2M = 2 * 1024 * 1024
NUMA = ["--profile", "numa", "--vcpus", "2", "--memory", "512M", "--guest-nodes", "2"]


@contextmanager
def runtime_at(root: Path) -> Iterator[Path]:
    """``root`` as hpcvm's runtime directory; afterwards every VM in it is stopped and
    nothing of theirs may be left."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(paths.ENV_RUNTIME_DIR, str(root))
        patch.setenv("HPCVM_READY_TIMEOUT", "180")
        before = Residue.take(root)
        yield root
        hpcvm("down", "--all", "--timeout", "10")
        assert_nothing_left(before)
    for log in Path("/var/log/libvirt/qemu").glob(f"hpcvm-vf{os.getpid()}-*.log"):
        log.unlink()  # libvirt's per-domain logs of this session's uniquely named VMs


@pytest.fixture
def runtime(tmp_path: Path, guest: None) -> Iterator[Path]:
    with runtime_at(tmp_path / "rt") as root:
        yield root


@pytest.fixture(scope="module")
def shared_runtime(tmp_path_factory: pytest.TempPathFactory, guest: None) -> Iterator[Path]:
    with runtime_at(tmp_path_factory.mktemp("shared") / "rt") as root:
        yield root


@pytest.fixture
def shared(shared_runtime: Path, hugepages: object) -> Iterator[str]:
    """The name of the shared QEMU VM (see the module docstring), running, in its
    runtime directory (which is the environment's for the test)."""
    name = f"vf{os.getpid()}-shared"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(paths.ENV_RUNTIME_DIR, str(shared_runtime))
        patch.setenv("HPCVM_READY_TIMEOUT", "180")
        if not _running(name):
            hpcvm("down", name, "--timeout", "10")  # a dead one's record and run dir
            up(name, "qemu", hugepages)
        record = state.load_machine(name)
        yield name
        if _running(name):  # the record as it was, whatever the test did to it
            state.save_machine(record)


def _running(name: str) -> bool:
    machine = state.read_machine(paths.run_dir(name))
    return (
        machine is not None and machine.pid is not None and procs.pid_alive(machine.pid, reap=True)
    )


def vcpu_tids_by_name(pid: int) -> dict[int, int]:
    """vCPU index -> tid from QEMU's thread names ("CPU 1/TCG")."""
    found: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        if comm.startswith("CPU ") and "/" in comm:
            found[int(comm[4 : comm.index("/")])] = int(tid)
    return found


def verify_json(name: str) -> tuple[int, dict[str, object], str]:
    done = hpcvm("verify", name, "--json")
    return done.returncode, json.loads(done.stdout) if done.stdout else {}, done.stderr


def failures(report: dict[str, object]) -> list[tuple[str, str, str]]:
    checks = report["checks"]
    assert isinstance(checks, list)
    return [(c["name"], c["expected"], c["actual"]) for c in checks if not c["ok"]]


def up(name: str, backend: str, hugepages: object, *extra: str) -> None:
    hugepages.ensure_free(PAGE_2M, 256 + 16)  # type: ignore[attr-defined]
    started = hpcvm("up", "--name", name, "--backend", backend, *NUMA, *extra)
    assert started.returncode == 0, started.stderr


def swap_pins(name: str, backend: str, uri: str | None) -> tuple[int, int]:
    """Pin vCPU 0 where vCPU 1 belongs and vice versa; return the two planned PUs."""
    machine = state.load_machine(name)
    assert machine.pid is not None
    pu0, pu1 = (p.host_pu for p in machine.plan.placements[:2])
    assert pu0 is not None and pu1 is not None and pu0 != pu1
    if backend == "qemu":
        tids = vcpu_tids_by_name(machine.pid)
        os.sched_setaffinity(tids[0], {pu1})
        os.sched_setaffinity(tids[1], {pu0})
    else:
        assert uri is not None
        conn = libvirt.open(uri)
        try:
            dom = conn.lookupByName(f"hpcvm-{name}")
            ncpus = max(pu0, pu1) + 1
            for vcpu, pu in ((0, pu1), (1, pu0)):
                dom.pinVcpuFlags(vcpu, tuple(i == pu for i in range(ncpus)), 1)  # LIVE
        finally:
            conn.close()
    return pu0, pu1


@pytest.mark.parametrize("backend", ["qemu", "libvirt"])
def test_verify_passes_then_reports_swapped_vcpu_pins(
    runtime: Path, hugepages: object, libvirtd: str, backend: str
) -> None:
    name = f"vf{os.getpid()}-{backend}"
    up(name, backend, hugepages, *(["--connect", libvirtd] if backend == "libvirt" else []))

    code, report, err = verify_json(name)
    assert code == 0, err
    assert report["ok"] is True and failures(report) == []
    names = {c["name"] for c in report["checks"]}  # type: ignore[union-attr]
    assert {"node 0 distances", "node 1 distances", "vCPU 0 affinity", "vCPU 1 affinity"} <= names
    assert "huge pages (2M) on host node 0" in names

    pu0, pu1 = swap_pins(name, backend, libvirtd)
    code, report, err = verify_json(name)
    assert code == 6, err
    assert failures(report) == [
        ("vCPU 0 affinity", str(pu0), str(pu1)),
        ("vCPU 1 affinity", str(pu1), str(pu0)),
    ]
    errors = [ln for ln in err.splitlines() if ln.startswith("hpcvm: error:")]
    assert len(errors) == 1 and "vCPU 0 affinity: expected" in errors[0]

    table = hpcvm("verify", name)  # the human form fails the same way
    assert table.returncode == 6 and "FAIL" in table.stdout


def test_record_claiming_three_vcpus_is_a_cpu_count_mismatch(shared: str) -> None:
    name = shared
    machine = state.load_machine(name)
    state.save_machine(
        machine.model_copy(update={"plan": machine.plan.model_copy(update={"vcpus": 3})})
    )
    code, report, err = verify_json(name)
    assert code == 6, err
    assert failures(report) == [("online CPUs", "3", "2")]
    state.save_machine(machine)
    assert verify_json(name)[0] == 0


def test_record_saying_another_node_is_a_memory_mismatch(shared: str) -> None:
    """Issue 8: QEMU binds the guest's memory to host node 0 (this host's only node);
    the recorded plan is changed to say node 1. verify reads where the memory really is
    (numa_maps of the QEMU process, pages the kernel placed) and fails naming node 0."""
    name = shared
    machine = state.load_machine(name)
    moved = tuple(r.model_copy(update={"host_nodes": (1,)}) for r in machine.plan.memory)
    state.save_machine(
        machine.model_copy(update={"plan": machine.plan.model_copy(update={"memory": moved})})
    )
    code, report, err = verify_json(name)
    assert code == 6, err
    failed = {n: actual for n, _expected, actual in failures(report)}
    assert "bound to node 0" in failed["memory bound outside the plan"]
    assert "memory bound to host node 1 (2M pages)" in failed
    state.save_machine(machine)
    assert verify_json(name)[0] == 0


def test_verify_of_a_dead_vm_and_of_no_vm(shared: str) -> None:
    """Last: it kills the shared VM."""
    missing = hpcvm("verify", "no-such-vm")
    assert missing.returncode == 2 and missing.stderr.count("hpcvm: error:") == 1

    name = shared
    machine = state.load_machine(name)
    assert machine.pid is not None
    os.kill(machine.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while procs.pid_alive(machine.pid, reap=True) and time.monotonic() < deadline:
        time.sleep(0.1)
    dead = hpcvm("verify", name)
    assert dead.returncode == 5, dead.stderr
    lines = [ln for ln in dead.stderr.splitlines() if ln.startswith("hpcvm: error:")]
    assert len(lines) == 1 and "not running" in lines[0] and "Traceback" not in dead.stderr
