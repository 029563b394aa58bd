"""GuestAgent against a real qemu-guest-agent, run on the host (no VM needed).

qemu-ga serves a unix socket itself with ``-m unix-listen``; the protocol is the one
it speaks over virtio-serial in a guest, so exec, exit codes, streams, stdin, timeouts,
file reads and a dropped connection are all tested against the real
agent. Commands that would act on the host itself (shutdown, suspend, freeze, setting
time/passwords/vCPUs) are disabled with ``-b``: the shutdown *error* path is tested,
the real shutdown is in tests/integration/test_guest_boot.py. Stale replies are tested
there too: they exist only on virtio-serial (qemu-ga's unix-listen mode gives each
client a fresh channel, and exits when a client leaves with replies unread).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.channels.agent import AgentCommandError, AgentGone, GuestAgent

QEMU_GA = "/usr/sbin/qemu-ga"
BLOCKED = ",".join(
    [
        "guest-shutdown",
        "guest-suspend-disk",
        "guest-suspend-ram",
        "guest-suspend-hybrid",
        "guest-fsfreeze-freeze",
        "guest-fsfreeze-freeze-list",
        "guest-fstrim",
        "guest-set-time",
        "guest-set-user-password",
        "guest-set-vcpus",
        "guest-set-memory-blocks",
        "guest-file-write",
    ]
)


@dataclass
class HostAgent:
    proc: subprocess.Popen[bytes]
    socket: Path

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


def _start(tmp: Path) -> HostAgent:
    sock = tmp / "qga.sock"
    argv = [QEMU_GA, "-m", "unix-listen", "-p", str(sock), "-f", str(tmp / "qga.pid")]
    argv += ["-t", str(tmp), "-b", BLOCKED]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"qemu-ga did not create {sock} (exit {proc.poll()})")
        time.sleep(0.02)
    return HostAgent(proc, sock)


@pytest.fixture
def host_agent(tmp_path: Path) -> Iterator[HostAgent]:
    if not os.access(QEMU_GA, os.X_OK):
        pytest.fail(f"{QEMU_GA} missing: apt-get install qemu-guest-agent (scripts/setup.sh)")
    agent = _start(tmp_path)
    try:
        yield agent
    finally:
        agent.kill()
        assert agent.proc.returncode is not None


def test_exec_returns_output_and_exit_code(host_agent: HostAgent) -> None:
    with GuestAgent(host_agent.socket, timeout=10) as agent:
        result = agent.exec(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert result.signal is None and result.seconds > 0


def test_exec_searches_path_and_passes_stdin(host_agent: HostAgent) -> None:
    with GuestAgent(host_agent.socket, timeout=10) as agent:
        assert agent.exec(["nproc"]).stdout.strip() == str(os.cpu_count())
        data = bytes(range(256)) * 300  # binary, larger than one read
        result = agent.exec(["sha256sum"], input=data)
    import hashlib

    assert result.stdout.split()[0] == hashlib.sha256(data).hexdigest()


def test_exec_reports_a_signal_like_a_shell(host_agent: HostAgent) -> None:
    with GuestAgent(host_agent.socket, timeout=10) as agent:
        result = agent.exec(["sh", "-c", "kill -TERM $$"])
    assert result.signal == signal.SIGTERM
    assert result.exit_code == 128 + signal.SIGTERM


def test_exec_of_missing_program_is_one_line(host_agent: HostAgent) -> None:
    with (
        GuestAgent(host_agent.socket, timeout=10) as agent,
        pytest.raises(AgentCommandError) as info,
    ):
        agent.exec(["/no/such/program"])
    message = str(info.value)
    assert "/no/such/program" in message and "\n" not in message


def test_exec_timeout_kills_the_process(host_agent: HostAgent, tmp_path: Path) -> None:
    marker = tmp_path / "sleeper"
    begin = time.monotonic()
    with GuestAgent(host_agent.socket, timeout=10) as agent, pytest.raises(RuntimeFailure) as info:
        agent.exec(["sh", "-c", f"echo $$ > {marker}; exec sleep 60"], timeout=1.0)
    assert "timed out" in str(info.value) and "killed" in str(info.value)
    assert time.monotonic() - begin < 30
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # killed and reaped by qemu-ga
            os.kill(pid, 0)
            time.sleep(0.05)


def test_osinfo_is_this_hosts(host_agent: HostAgent) -> None:
    with GuestAgent(host_agent.socket, timeout=10) as agent:
        assert agent.osinfo()["kernel-release"] == os.uname().release


def test_read_file_returns_the_bytes(host_agent: HostAgent, tmp_path: Path) -> None:
    data = os.urandom(200_000)  # several guest-file-read chunks
    (tmp_path / "blob").write_bytes(data)
    with GuestAgent(host_agent.socket, timeout=10) as agent:
        assert agent.read_file(str(tmp_path / "blob")) == data
        assert agent.read_file(str(tmp_path / "blob"), limit=10) == data[:10]
        with pytest.raises(AgentCommandError):
            agent.read_file(str(tmp_path / "missing"))


def test_refused_shutdown_is_reported(host_agent: HostAgent) -> None:
    with (
        GuestAgent(host_agent.socket, timeout=10) as agent,
        pytest.raises(AgentCommandError, match="shut down"),
    ):
        agent.shutdown(wait=5.0)


def test_agent_dying_mid_exec_says_the_vm_stopped(host_agent: HostAgent) -> None:
    agent = GuestAgent(host_agent.socket, timeout=10)
    agent.ping()
    killer = subprocess.Popen(["sh", "-c", f"sleep 1; kill -KILL {host_agent.proc.pid}"])
    try:
        with pytest.raises(AgentGone) as info:
            agent.exec(["sleep", "30"], timeout=60)
    finally:
        killer.wait()
        agent.close()
    assert "the VM stopped while running 'sleep'" in str(info.value)


def test_connect_to_nothing_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure) as info:
        GuestAgent(tmp_path / "none.sock", timeout=2).ping()
    assert "none.sock" in str(info.value) and "\n" not in str(info.value)


def test_wait_ready_returns_once_the_agent_answers(tmp_path: Path) -> None:
    """The socket appears only after wait_ready started, as when QEMU boots a guest."""
    agent = GuestAgent(tmp_path / "qga.sock", timeout=5)
    starter = subprocess.Popen(["sleep", "1"])
    started: list[HostAgent] = []
    try:

        def alive() -> bool:
            if starter.poll() is not None and not started:
                started.append(_start(tmp_path))
            return True

        waited = agent.wait_ready(time.monotonic() + 60, alive)
        assert waited >= 1.0
        agent.ping()
    finally:
        agent.close()
        starter.wait()
        for host in started:
            host.kill()


def test_wait_ready_gives_up_at_the_deadline_naming_the_log(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    agent = GuestAgent(tmp_path / "qga.sock", timeout=5, console_log=log)
    begin = time.monotonic()
    with pytest.raises(RuntimeFailure) as info:
        agent.wait_ready(begin + 2.0, lambda: True)
    assert 2.0 <= time.monotonic() - begin < 10
    assert str(log) in str(info.value) and "\n" not in str(info.value)


def test_wait_ready_stops_at_once_when_the_vm_died(tmp_path: Path) -> None:
    agent = GuestAgent(tmp_path / "qga.sock", timeout=5, console_log=tmp_path / "c.log")
    begin = time.monotonic()
    with pytest.raises(RuntimeFailure, match="before the VM stopped"):
        agent.wait_ready(begin + 60, lambda: False)
    assert time.monotonic() - begin < 5


def test_wait_ready_retries_a_silent_listener(tmp_path: Path) -> None:
    """A socket that accepts but never answers (QEMU before the guest's agent runs)."""
    path = tmp_path / "silent.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(8)
    console = tmp_path / "c.log"
    stuck = b"\nhpcvm-guest: stuck \x1b[0m here\r\n\n"
    console.write_bytes(b"[    1.0] booting\r\n" + b"x" * 5000 + stuck)
    agent = GuestAgent(path, timeout=5, console_log=console)
    try:
        begin = time.monotonic()
        with pytest.raises(RuntimeFailure, match="did not answer") as failed:
            agent.wait_ready(begin + 3.0, lambda: True)
        assert time.monotonic() - begin < 10
        # the console's last line is named (control characters dropped), not the first
        assert "(its last line: 'hpcvm-guest: stuck [0m here')" in str(failed.value)
    finally:
        agent.close()
        with contextlib.suppress(OSError):
            server.close()
