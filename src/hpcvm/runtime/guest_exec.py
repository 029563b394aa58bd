"""Commands in a running guest, through its agent, with one meaning for their errors:
``ExecTimeout`` (exit 124, like timeout(1)) when the command outlives its timeout,
``ExecInterrupted`` (a KeyboardInterrupt: exit 130) when its caller is interrupted, the
command ended in the guest in both cases; ``ProgramNotFound`` (127) and
``ProgramNotExecutable`` (126) as a shell says them (runtime/agent.py); a
``RuntimeFailure`` naming the console log when the VM is gone or died meanwhile, which
QEMU's own process decides (``qemu_runs``), never a failed agent request; ``AgentBusy``
(exit 8) when another client holds the agent past the timeout.

``connected(machine)`` opens the agent connection a caller keeps for several commands
(bench keeps one for a VM's life: a new connection costs some 100 ms of sync under
TCG); ``exec_on`` runs one command on it; ``exec_in`` opens, runs and closes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpcvm.errors import HpcvmError, RuntimeFailure, UsageError
from hpcvm.runtime.backends import get_backend
from hpcvm.runtime.model import ExecResult, Machine
from hpcvm.runtime.timeouts import EXEC_TIMEOUT_EXIT

if TYPE_CHECKING:
    from hpcvm.runtime.agent import GuestAgent

AGENT_TIMEOUT = 30.0  # seconds for the agent's own answers (not the command's run)


class ExecTimeout(RuntimeFailure):
    """A guest command outlived its timeout; exits 124 like timeout(1)."""

    exit_code = EXEC_TIMEOUT_EXIT


@contextlib.contextmanager
def connected(machine: Machine, timeout: float = AGENT_TIMEOUT) -> Iterator[GuestAgent]:
    """An open connection to ``machine``'s guest agent, closed after the block."""
    from hpcvm.runtime.agent import GuestAgent

    if not machine.boot.agent_socket:
        raise RuntimeFailure(f"VM {machine.name} has no guest agent socket")
    agent = GuestAgent(
        machine.boot.agent_socket, timeout=timeout, console_log=machine.boot.serial_log
    )
    try:
        yield agent
    finally:
        agent.close()


def exec_on(
    machine: Machine,
    agent: GuestAgent,
    argv: Sequence[str],
    timeout: float | None = None,
    *,
    input: bytes | None = None,
    env: Sequence[str] | None = None,
    finished: Callable[[float], bool] | None = None,
    alive: Callable[[Machine], bool] | None = None,
    poll_max: float | None = None,
) -> ExecResult:
    """Run ``argv`` (no shell) on an open connection; its output and exit code.
    ``alive`` says whether the VM runs (default: its backend's answer). Interrupted
    (KeyboardInterrupt) or past ``timeout``, the command is ended in the guest first:
    ExecInterrupted or ExecTimeout then say how, naming the VM."""
    from hpcvm.runtime.agent_errors import CommandTimedOut, ExecInterrupted

    if not argv:
        raise UsageError("nothing to run: give a command after --")
    if alive is None:
        alive = get_backend(machine.backend, machine.connect_uri).alive
    if not alive(machine) and not qemu_runs(machine):
        raise RuntimeFailure(
            f"VM {machine.name} is not running (QEMU pid {machine.pid} gone)", cause="qemu"
        )
    try:
        return agent.exec(
            list(argv),
            timeout=timeout,
            input=input,
            env=list(env) if env is not None else None,
            finished=finished,
            poll_max=poll_max,
        )
    except ExecInterrupted as exc:
        raise ExecInterrupted(f"in VM {machine.name}, {exc.what}") from exc
    except HpcvmError as exc:
        if not alive(machine) and not qemu_runs(machine):
            raise RuntimeFailure(
                f"VM {machine.name} died while running {argv[0]!r}; see its console log "
                f"{machine.boot.serial_log}"
            ) from exc
        if timeout is not None and isinstance(exc, CommandTimedOut):
            raise ExecTimeout(
                f"{argv[0]!r} did not finish within {timeout:g} s in VM {machine.name} "
                f"and {exc.ended}"
            ) from exc
        raise


def qemu_runs(machine: Machine) -> bool:
    """Whether ``machine``'s QEMU runs, by the process itself: its pid is a live process
    whose command line names this VM's agent socket (a reused pid runs something else).
    What decides that a VM died, whatever a caller's ``alive`` (or a record's start
    time) says: a failed agent request alone never does (the agent may be busy or the
    guest hung while QEMU runs). For a backend whose QEMU names no such socket
    (libvirt's), the backend's own answer."""
    from hpcvm.procs import pid_alive

    if machine.pid is None or not machine.boot.agent_socket:
        return False
    if not pid_alive(machine.pid, reap=True):
        return False
    try:
        cmdline = Path(f"/proc/{machine.pid}/cmdline").read_bytes()
    except OSError:
        return False
    if machine.boot.agent_socket.encode() in cmdline:
        return True
    return get_backend(machine.backend, machine.connect_uri).alive(machine)


def exec_in(
    machine: Machine,
    argv: Sequence[str],
    timeout: float | None = None,
    *,
    input: bytes | None = None,
    env: Sequence[str] | None = None,
    poll_max: float | None = None,
) -> ExecResult:
    """``exec_on`` on a connection of its own."""
    if not argv:
        raise UsageError("nothing to run: give a command after --")
    with connected(machine) as agent:
        return exec_on(machine, agent, argv, timeout, input=input, env=env, poll_max=poll_max)
