"""Ending guest commands, their stdin and a program that does not start, against a real
qemu-guest-agent run on the host (tests/unit/test_agent_client.py's ``-m unix-listen``
agent; its "guest" is this host, so the processes it starts are checked in this /proc).

- interrupted (a real SIGINT to this process) or past its timeout, the command and the
  processes it started are gone, by SIGTERM, or by SIGKILL when it ignores SIGTERM;
- a program that is missing is exit 127, one that cannot be executed 126, as a shell;
- stdin up to MAX_INPUT arrives whole, and the agent itself refuses a message past it.

The same behaviours through the CLI in a booted guest: tests/integration/
test_exec_signals.py.
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.runtime.channels.agent import GuestAgent
from hpcvm.runtime.channels.agent_errors import (
    MAX_INPUT,
    AgentCommandError,
    CommandTimedOut,
    ExecInterrupted,
    InputTooLarge,
    ProgramNotExecutable,
    ProgramNotFound,
)
from hpcvm.runtime.channels.guest_process import END_GRACE
from tests.unit.test_agent_client import QEMU_GA, HostAgent, _start

# A shell that starts a child and waits: both pids are written to $1 (sh first).
PARENT_AND_CHILD = 'echo $$ > "$1"; sleep 300 & echo $! >> "$1"; wait'


@pytest.fixture
def ga(tmp_path: Path) -> Iterator[HostAgent]:
    if not os.access(QEMU_GA, os.X_OK):
        pytest.fail(f"{QEMU_GA} missing: apt-get install qemu-guest-agent (scripts/setup.sh)")
    agent = _start(tmp_path)
    try:
        yield agent
    finally:
        agent.kill()


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def _pids(marker: Path) -> list[int]:
    deadline = time.monotonic() + 10
    while len(text := (marker.read_text() if marker.exists() else "").split()) < 2:
        assert time.monotonic() < deadline, "the command did not write its pids"
        time.sleep(0.05)
    return [int(p) for p in text]


@pytest.fixture(autouse=True)
def _sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, as at a terminal: a test run started in the
    background by a shell inherits SIGINT ignored, and Python then installs no handler
    (the interrupt tests waited out their guest commands' 300 s)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _interrupt_in(seconds: float) -> threading.Timer:
    """A real SIGINT to this process after ``seconds`` (Python raises KeyboardInterrupt
    in the main thread, where the agent waits)."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_an_interrupted_command_and_its_child_are_ended(ga: HostAgent, tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    _interrupt_in(1.5)
    with GuestAgent(ga.socket, timeout=10) as agent, pytest.raises(ExecInterrupted) as info:
        agent.exec(["sh", "-c", PARENT_AND_CHILD, "sh", str(marker)])
    pids = _pids(marker)
    assert all(p > 0 for p in pids) and not any(_running(p) for p in pids)
    assert "was killed with SIGTERM" in info.value.what
    assert f"pid {pids[0]} in the guest" in info.value.what


def test_a_command_that_ignores_sigterm_is_killed(ga: HostAgent, tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    script = f"trap '' TERM; {PARENT_AND_CHILD}"  # the child inherits the ignored TERM
    _interrupt_in(1.5)
    begin = time.monotonic()
    with GuestAgent(ga.socket, timeout=10) as agent, pytest.raises(ExecInterrupted) as info:
        agent.exec(["sh", "-c", script, "sh", str(marker)])
    assert time.monotonic() - begin >= 1.5 + END_GRACE  # TERM first, KILL after the grace
    assert not any(_running(p) for p in _pids(marker))
    assert "SIGKILL" in info.value.what


def test_a_timed_out_command_and_its_child_are_ended(ga: HostAgent, tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    with GuestAgent(ga.socket, timeout=10) as agent:
        with pytest.raises(CommandTimedOut) as info:
            agent.exec(["sh", "-c", PARENT_AND_CHILD, "sh", str(marker)], timeout=1.0)
        assert agent.exec(["true"]).exit_code == 0  # the connection is still in step
    assert not any(_running(p) for p in _pids(marker))
    assert "timed out after 1 s" in str(info.value) and info.value.exit_code == 5


def test_a_missing_program_is_127_and_a_non_executable_126(ga: HostAgent) -> None:
    with GuestAgent(ga.socket, timeout=10) as agent:
        with pytest.raises(ProgramNotFound) as missing:
            agent.exec(["no-such-program-hpcvm"])
        with pytest.raises(ProgramNotFound):
            agent.exec(["/no/such/program"])
        with pytest.raises(ProgramNotExecutable) as data_file:
            agent.exec(["/etc/passwd"])
        with pytest.raises(ProgramNotExecutable):
            agent.exec(["/etc"])
        assert agent.exec(["true"]).exit_code == 0
    assert missing.value.exit_code == 127 and data_file.value.exit_code == 126
    assert "command not found" in str(missing.value) and "\n" not in str(missing.value)
    assert isinstance(missing.value, AgentCommandError)  # callers that caught it still do


def test_stdin_up_to_the_limit_arrives_whole(ga: HostAgent) -> None:
    data = os.urandom(MAX_INPUT)
    with GuestAgent(ga.socket, timeout=60) as agent:
        result = agent.exec(["sha256sum"], input=data)
        assert result.stdout.split()[0] == hashlib.sha256(data).hexdigest()
        with pytest.raises(InputTooLarge) as info:
            agent.exec(["sha256sum"], input=data + b"x")
        assert info.value.exit_code == 2 and "--share" in str(info.value)


def test_the_limit_is_the_agents(ga: HostAgent) -> None:
    """64 KiB past MAX_INPUT the agent itself refuses the message (its JSON parser's
    64 MiB limit), so MAX_INPUT is at most 64 KiB short of what it takes."""
    over = base64.b64encode(os.urandom(MAX_INPUT + 64 * 1024)).decode()
    with GuestAgent(ga.socket, timeout=60) as agent, pytest.raises(AgentCommandError) as info:
        agent.call("guest-exec", {"path": "true", "input-data": over})
    assert "size limit" in info.value.desc
