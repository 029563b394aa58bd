"""The libvirt backend through the real CLI: up, exec, verify, down on qemu:///system.

The built-in guest boots under TCG on a libvirtd the session fixture starts (or finds).
Each test runs in its own runtime directory and ends by checking that nothing is left:
the runtime helper's Residue checks (processes, run dirs, huge pages, taps) plus what
only libvirt can leave: a domain definition, a QEMU libvirt started (its command line
names the domain, not the run dir) and the agent socket. Expected values come from the
plan read back from the record, from /proc and from libvirt's own answers, never from
the backend under test.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from hpcvm import procs
from hpcvm.runtime.backends.libvirt_backend import find_qemu_pid
from hpcvm.runtime.machine import state
from tests.runtime_support import hpcvm, isolated_runtime

pytestmark = pytest.mark.integration

PAGE_2M = 2 * 1024 * 1024

CASES = {
    "naive": ["--profile", "naive", "--vcpus", "2", "--memory", "512M"],
    "pinned": ["--profile", "pinned", "--vcpus", "2", "--memory", "512M"],
    "hugepages": ["--profile", "hugepages", "--vcpus", "2", "--memory", "512M"],
    "numa": ["--profile", "numa", "--vcpus", "2", "--memory", "512M", "--guest-nodes", "2"],
    # hpc on 2 PUs: 1 vCPU, QEMU's own threads on the housekeeping PU (libvirt emulatorpin)
    "hpc": ["--profile", "hpc", "--vcpus", "1", "--memory", "256M"],
}


def libvirt_leftovers(uri: str, name: str, agent_socket: str | None) -> list[str]:
    """What a libvirt VM named ``name`` could leave: definition, QEMU, socket."""
    domain = f"hpcvm-{name}"
    problems = []
    conn = libvirt.open(uri)
    try:
        if domain in conn.listDefinedDomains() or domain in [
            d.name() for d in conn.listAllDomains()
        ]:
            problems.append(f"libvirt domain {domain} still defined")
    finally:
        conn.close()
    pid = find_qemu_pid(domain)
    if pid is not None:
        problems.append(f"QEMU pid {pid} of {domain} still running")
    if agent_socket and Path(agent_socket).exists():
        problems.append(f"agent socket {agent_socket} left")
    return problems


@pytest.fixture
def runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guest: None, libvirtd: str
) -> Iterator[Path]:
    # Names are per test directory: other sessions on this machine may run the same tests
    # against the same libvirtd, and libvirt domain names are global.
    with isolated_runtime(
        tmp_path, monkeypatch, lambda: hpcvm("down", "--all", "--timeout", "10")
    ) as root:
        yield root
    for log in Path("/var/log/libvirt/qemu").glob(f"hpcvm-lv{os.getpid()}-*.log"):
        log.unlink()  # libvirt's per-domain logs of this session's uniquely named VMs


def unique(tmp_path: Path, case: str) -> str:
    """A VM name no other test session on this machine uses (domain names are global)."""
    return f"lv{os.getpid()}-{case}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_up_exec_verify_down(
    runtime: Path, tmp_path: Path, libvirtd: str, hugepages: object, case: str
) -> None:
    name = unique(tmp_path, case)
    hugepages.ensure_free(PAGE_2M, 256 + 16)  # type: ignore[attr-defined]
    up = hpcvm("up", "--name", name, "--backend", "libvirt", "--connect", libvirtd, *CASES[case])
    assert up.returncode == 0, up.stderr
    machine = state.load_machine(name)
    plan = machine.plan
    assert machine.backend == "libvirt" and machine.connect_uri == libvirtd
    assert machine.pid is not None and state.is_qemu_process(machine.pid)

    # libvirt knows the domain, runs it, and its QEMU is the recorded pid.
    conn = libvirt.open(libvirtd)
    try:
        dom = conn.lookupByName(f"hpcvm-{name}")
        assert dom.isActive() and dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
        pins = dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)
    finally:
        conn.close()
    assert find_qemu_pid(f"hpcvm-{name}") == machine.pid
    for p in plan.placements:  # libvirt's cputune is the plan's pinning
        if p.host_pu is not None:
            assert {i for i, on in enumerate(pins[p.vcpu]) if on} == {p.host_pu}

    nproc = hpcvm("exec", name, "--", "nproc")
    assert nproc.returncode == 0, nproc.stderr
    assert int(nproc.stdout) == plan.vcpus
    again = hpcvm("exec", name, "--", "cat", "/sys/devices/system/node/online")
    assert again.returncode == 0, again.stderr  # a second client gets the agent too
    nodes = len(plan.guest_nodes)
    assert again.stdout.strip() == (f"0-{nodes - 1}" if nodes > 1 else "0")

    verified = hpcvm("verify", name, "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    names = {c["name"] for c in report["checks"]}
    assert report["ok"] and {"online CPUs", "NUMA nodes", "clocksource"} <= names
    if plan.pinned:
        assert {f"vCPU {p.vcpu} affinity" for p in plan.placements} <= names
    if plan.hugepages_needed:
        assert any(n.startswith("huge pages (2M) on host node") for n in names)
    if plan.emulator_pus:
        assert "emulator threads affinity" in names
    if any(r.policy == "bind" for r in plan.memory):
        assert any(n.startswith("memory bound to host node") for n in names)

    down = hpcvm("down", name)
    assert down.returncode == 0, down.stderr
    assert not procs.pid_alive(machine.pid, reap=True)
    assert libvirt_leftovers(libvirtd, name, machine.boot.agent_socket) == []
    assert not Path(machine.run_dir).exists()


def test_failed_start_leaves_no_definition(runtime: Path, tmp_path: Path, libvirtd: str) -> None:
    """A kernel QEMU cannot load: libvirt refuses to start the domain; the error is one
    line naming libvirt's reason, and the definition is gone again."""
    name = unique(tmp_path, "badkernel")
    kernel = tmp_path / "not-a-kernel"
    kernel.write_bytes(b"this is not a bzImage\n")
    initrd = tmp_path / "initrd"
    initrd.write_bytes(b"")
    up = hpcvm(
        "up", "--name", name, "--backend", "libvirt", "--connect", libvirtd,
        "--profile", "naive", "--vcpus", "1", "--memory", "256M",
        "--kernel", str(kernel), "--initrd", str(initrd), "--ready-timeout", "60",
    )  # fmt: skip
    assert up.returncode == 5, up.stderr
    errors = [ln for ln in up.stderr.splitlines() if ln.startswith("hpcvm: error:")]
    assert len(errors) == 1 and "Traceback" not in up.stderr, up.stderr
    assert "hpcvm-" + name in errors[0]
    assert libvirt_leftovers(libvirtd, name, None) == []


def test_unreachable_libvirt_is_one_line_and_leaves_nothing(runtime: Path, tmp_path: Path) -> None:
    name = unique(tmp_path, "nouri")
    bad = f"qemu:///system?socket={tmp_path}/no-such-libvirt-sock"
    up = hpcvm(
        "up", "--name", name, "--backend", "libvirt", "--connect", bad,
        "--profile", "naive", "--vcpus", "1", "--memory", "256M",
    )  # fmt: skip
    assert up.returncode == 5, up.stderr
    errors = [ln for ln in up.stderr.splitlines() if ln.startswith("hpcvm: error:")]
    assert len(errors) == 1 and "cannot connect to libvirt" in errors[0], up.stderr
    assert not (runtime / name).exists()


def test_domain_of_another_vm_is_refused_and_left_alone(
    runtime: Path, tmp_path: Path, libvirtd: str
) -> None:
    """A domain named like ours but not made for this run dir (another session, or the
    user's own): ``up`` refuses with a one-line error and does not touch it."""
    name = unique(tmp_path, "taken")
    xml = (
        f"<domain type='qemu'><name>hpcvm-{name}</name><memory unit='MiB'>64</memory>"
        "<vcpu>1</vcpu><os><type arch='x86_64' machine='q35'>hvm</type></os></domain>"
    )
    conn = libvirt.open(libvirtd)
    dom = conn.defineXML(xml)
    try:
        up = hpcvm(
            "up", "--name", name, "--backend", "libvirt", "--connect", libvirtd,
            "--profile", "naive", "--vcpus", "1", "--memory", "256M",
        )  # fmt: skip
        assert up.returncode == 5, up.stderr
        assert "already exists (not this VM's)" in up.stderr
        assert conn.lookupByName(f"hpcvm-{name}").UUIDString() == dom.UUIDString()
        assert not (runtime / name).exists()
    finally:
        dom.undefine()
        conn.close()


def test_pause_and_resume(runtime: Path, libvirtd: str) -> None:
    """suspend/resume through the backend: libvirt and `hpcvm ps` see each state, and
    the guest answers again after resume."""
    from hpcvm.runtime.backends.registry import get_backend

    name = f"lv{os.getpid()}-pause"
    up = hpcvm("up", "--name", name, "--backend", "libvirt", "--connect", libvirtd,
               "--profile", "naive", "--vcpus", "1", "--memory", "256M")  # fmt: skip
    assert up.returncode == 0, up.stderr
    machine = state.load_machine(name)
    backend = get_backend("libvirt", libvirtd)
    backend.pause(machine)
    conn = libvirt.open(libvirtd)
    try:
        assert conn.lookupByName(f"hpcvm-{name}").state()[0] == libvirt.VIR_DOMAIN_PAUSED
    finally:
        conn.close()
    listed = json.loads(hpcvm("ps", "--json").stdout)
    assert [(r["name"], r["state"]) for r in listed] == [(name, "paused")]
    backend.resume(machine)
    listed = json.loads(hpcvm("ps", "--json").stdout)
    assert [(r["name"], r["state"]) for r in listed] == [(name, "running")]
    done = hpcvm("exec", name, "--", "true")
    assert done.returncode == 0, done.stderr
