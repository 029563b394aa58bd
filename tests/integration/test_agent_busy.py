"""Two clients of one running VM's guest agent, and QEMU's own memory, on one booted
built-in guest (TCG, 1 vCPU, 256 MiB).

QEMU's agent socket serves one client at a time, and a second client's connect succeeds
anyway (it waits in the backlog), so a held agent once looked silent and then dead:
``hpcvm exec`` beside a ``cluster wait`` holding the agent said "VM died" while the VM
ran. Here a real ``hpcvm exec`` holds the agent (its command runs) while a second one
asks: the second waits for it, and past its agent timeout says the agent is busy (exit
8, BusyError), never that the VM died; the VM still runs (its QEMU in /proc). A VM whose
record's start time disagrees with its QEMU's (the old test for a reused pid) is not
called dead either while its QEMU runs (runtime/vm/guest_exec.qemu_runs).

The agent's relay (runtime/channels/agent_relay.py) holds QEMU's agent socket between
clients, as QEMU itself says (``query-chardev``: connected while no hpcvm command
runs), runs as QEMU's user, and is gone once ``down`` returns; with it killed, ``exec``
goes on through QEMU's socket.

And QEMU's own memory under TCG (the kernel's VmRSS less the guest RAM mapping's Rss,
from /proc/PID/smaps) is within what the plan's memory check allowed for it
(plan/memory.qemu_overhead).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcvm.plan.memory import qemu_overhead
from hpcvm.runtime.backends.qemu_backend import QemuBackend
from hpcvm.runtime.channels.agent_errors import ProgramNotFound
from hpcvm.runtime.machine import state
from hpcvm.runtime.vm.guest_exec import connected, exec_on, qemu_runs
from hpcvm.units import MIB
from tests.runtime_support import HPCVM, one_line_error, qemu_pids_using, relay_pids_using

pytestmark = pytest.mark.integration

MEMORY = 256 * MIB
SHAPE = ["--profile", "naive", "--vcpus", "1", "--memory", "256M", "--accel", "tcg"]
AGENT_TIMEOUT = 30.0  # guest_exec.AGENT_TIMEOUT: how long a second client waits


@dataclass(frozen=True)
class Vm:
    name: str
    runtime: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "HPCVM_RUNTIME_DIR": str(self.runtime)}

    def hpcvm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [HPCVM, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [HPCVM, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(),
        )

    def machine_pid(self) -> int:
        machine = state.read_machine(self.runtime / self.name)
        assert machine is not None and machine.pid is not None
        return machine.pid


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory, guest: None) -> Iterator[Vm]:
    here = Vm(f"busy{os.getpid()}", tmp_path_factory.mktemp("agent-busy") / "rt")
    try:
        up = here.hpcvm("up", "--name", here.name, *SHAPE, timeout=600)
        assert up.returncode == 0, up.stderr
        yield here
    finally:
        here.hpcvm("down", "--all", timeout=300)
        assert qemu_pids_using(here.runtime) == set()
        assert relay_pids_using(here.runtime) == set()  # down waited for the relay's end
        shutil.rmtree(here.runtime, ignore_errors=True)


def _qemu_alive(pid: int) -> bool:
    """The kernel's word: ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_second_client_waits_for_the_first(vm: Vm) -> None:
    first = vm.popen("exec", vm.name, "--", "sleep", "4")
    time.sleep(1.5)  # the first holds the agent: its command runs
    begin = time.monotonic()
    second = vm.hpcvm("exec", vm.name, "--", "echo", "second")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "second"
    assert first.wait(timeout=120) == 0
    assert time.monotonic() - begin < AGENT_TIMEOUT


def test_a_held_agent_is_busy_not_dead(vm: Vm) -> None:
    hold = AGENT_TIMEOUT + 20
    first = vm.popen("exec", vm.name, "--", "sleep", f"{hold:g}")
    try:
        time.sleep(2.0)
        second = vm.hpcvm("exec", vm.name, "--", "true", timeout=hold + 60)
        line = one_line_error(second)
        assert second.returncode == 8, second.stderr  # errors.BusyError
        assert "died" not in line and "in use by" in line and "exec" in line, line
        assert "wait for that command to end, or retry" in line
        assert _qemu_alive(vm.machine_pid())
    finally:
        assert first.wait(timeout=hold + 120) == 0, first.stderr.read() if first.stderr else ""
    again = vm.hpcvm("exec", vm.name, "--", "true")  # and the agent serves again
    assert again.returncode == 0, again.stderr


def test_a_failed_request_never_calls_a_running_vm_dead(vm: Vm) -> None:
    machine = state.read_machine(vm.runtime / vm.name)
    assert machine is not None
    # A record started an hour before its QEMU: the backend's reused-pid test says gone.
    stale = machine.model_copy(update={"started_at": machine.started_at - 3600})
    assert not QemuBackend().alive(stale)
    assert qemu_runs(stale)  # the process itself: live, and serving this VM's socket
    with connected(stale) as agent, pytest.raises(ProgramNotFound):
        exec_on(stale, agent, ["/nonexistent-hpcvm-program"])


def test_qemus_own_memory_is_within_the_plans_allowance(vm: Vm) -> None:
    pid = vm.machine_pid()
    rss = guest_ram = 0
    size = 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if line.startswith("Size:"):
            size = int(line.split()[1]) * 1024
        elif line.startswith("Rss:") and size == MEMORY:
            guest_ram += int(line.split()[1]) * 1024  # the guest RAM mapping (4K pages)
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    own = rss - guest_ram
    assert 0 < own <= qemu_overhead(MEMORY, "tcg"), (own // MIB, guest_ram // MIB)


def _status_ids(pid: int) -> tuple[str, str]:
    """The real uid and gid of ``pid``, from the kernel."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return fields["Uid"].split()[0], fields["Gid"].split()[0]


def _agent_chardev(vm: Vm) -> str:
    """QEMU's own description of the agent's chardev (``query-chardev``)."""
    machine = state.read_machine(vm.runtime / vm.name)
    assert machine is not None
    for dev in QemuBackend().qmp(machine, "query-chardev"):
        if dev["label"] == "qga0":
            return str(dev["filename"])
    raise AssertionError("QEMU has no qga0 chardev")


def test_the_relay_holds_the_agent_as_qemus_user(vm: Vm) -> None:
    pid = int((vm.runtime / vm.name / "relay.sock.pid").read_text())
    assert relay_pids_using(vm.runtime) == {pid}
    assert _status_ids(pid) == _status_ids(vm.machine_pid())  # dropped to QEMU's user
    # no hpcvm command runs now, yet QEMU's agent end has a client: the relay's
    assert not _agent_chardev(vm).startswith("disconnected:"), _agent_chardev(vm)
    done = vm.hpcvm("exec", vm.name, "--", "echo", "through the relay")
    assert done.returncode == 0 and done.stdout.strip() == "through the relay", done.stderr


def test_exec_goes_on_through_qemus_socket_without_the_relay(vm: Vm) -> None:
    """Last in the module: the VM keeps no relay after it."""
    pid = int((vm.runtime / vm.name / "relay.sock.pid").read_text())
    os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while relay_pids_using(vm.runtime) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert relay_pids_using(vm.runtime) == set()
    deadline = time.monotonic() + 10  # QEMU notices the client's end on its next poll
    while not _agent_chardev(vm).startswith("disconnected:") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _agent_chardev(vm).startswith("disconnected:"), _agent_chardev(vm)
    done = vm.hpcvm("exec", vm.name, "--", "echo", "without it")
    assert done.returncode == 0 and done.stdout.strip() == "without it", done.stderr
