"""Commands in a running guest, through its agent, with one meaning for their errors:
``ExecTimeout`` (exit 124, like timeout(1)) when the command outlives its timeout,
``ExecInterrupted`` (a KeyboardInterrupt: exit 130) when its caller is interrupted, the
command ended in the guest in both cases; ``ProgramNotFound`` (127) and
``ProgramNotExecutable`` (126) as a shell says them (runtime/channels/agent.py); a
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
from typing import TYPE_CHECKING, TypeVar

from hpcvm.errors import HpcvmError, RuntimeFailure, UsageError
from hpcvm.runtime.backends.registry import own_process
from hpcvm.runtime.machine.exec_result import ExecResult
from hpcvm.runtime.machine.handle import VmHandle, handle_of
from hpcvm.runtime.machine.timeouts import EXEC_TIMEOUT_EXIT

if TYPE_CHECKING:
    from hpcvm.runtime.channels.agent import GuestAgent
    from hpcvm.runtime.machine.model import Machine

# A full record (bench, cluster) or the handle `hpcvm exec` reads without pydantic
# (runtime/machine/handle.py): everything here serves both.
VM = TypeVar("VM", "Machine", VmHandle)

AGENT_TIMEOUT = 30.0  # seconds for the agent's own answers (not the command's run)


class ExecTimeout(RuntimeFailure):
    """A guest command outlived its timeout; exits 124 like timeout(1)."""

    exit_code = EXEC_TIMEOUT_EXIT


@contextlib.contextmanager
def connected(machine: Machine | VmHandle, timeout: float = AGENT_TIMEOUT) -> Iterator[GuestAgent]:
    """An open connection to ``machine``'s guest agent, closed after the block."""
    from hpcvm.runtime.channels.agent import GuestAgent

    vm = handle_of(machine)
    if not vm.agent_socket:
        raise RuntimeFailure(f"VM {vm.name} has no guest agent socket")
    agent = GuestAgent(vm.agent_socket, timeout=timeout, console_log=vm.serial_log)
    try:
        yield agent
    finally:
        agent.close()


def exec_on(
    machine: VM,
    agent: GuestAgent,
    argv: Sequence[str],
    timeout: float | None = None,
    *,
    input: bytes | None = None,
    env: Sequence[str] | None = None,
    finished: Callable[[float], bool] | None = None,
    alive: Callable[[VM], bool] | None = None,
    poll_max: float | None = None,
) -> ExecResult:
    """Run ``argv`` (no shell) on an open connection; its output and exit code.
    ``alive`` says whether the VM runs (default: its backend's answer). Interrupted
    (KeyboardInterrupt) or past ``timeout``, the command is ended in the guest first:
    ExecInterrupted or ExecTimeout then say how, naming the VM."""
    from hpcvm.runtime.channels.agent_errors import CommandTimedOut, ExecInterrupted

    if not argv:
        raise UsageError("nothing to run: give a command after --")
    vm = handle_of(machine)
    asks = alive if alive is not None else _default_alive
    if not asks(machine) and not qemu_runs(machine):
        raise RuntimeFailure(f"VM {vm.name} is not running (QEMU pid {vm.pid} gone)", cause="qemu")
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
        raise ExecInterrupted(f"in VM {vm.name}, {exc.what}") from exc
    except HpcvmError as exc:
        if not asks(machine) and not qemu_runs(machine):
            raise RuntimeFailure(
                f"VM {vm.name} died while running {argv[0]!r}; see its console log {vm.serial_log}"
            ) from exc
        if timeout is not None and isinstance(exc, CommandTimedOut):
            raise ExecTimeout(
                f"{argv[0]!r} did not finish within {timeout:g} s in VM {vm.name} and {exc.ended}"
            ) from exc
        raise


def _default_alive(machine: Machine | VmHandle) -> bool:
    """The backend's own answer. For a handle of a backend whose VM is the QEMU process
    hpcvm started (runtime/backends/registry.py ``own_process``: hpcvm's QEMU backend),
    none: ``qemu_runs`` asks the process itself, which is what that backend would (so
    exec loads no models); any other backend (libvirt, a plugin's) is asked on the full
    record, as before."""
    if isinstance(machine, VmHandle):
        if own_process(machine.backend):
            return False
        full = machine.machine()
        if full is None:
            return False
        machine = full
    from hpcvm.runtime.backends.registry import get_backend

    return get_backend(machine.backend, machine.connect_uri).alive(machine)


def qemu_runs(machine: Machine | VmHandle) -> bool:
    """Whether ``machine``'s QEMU runs, by the process itself: its pid is a live process
    whose command line names this VM's agent socket (a reused pid runs something else).
    What decides that a VM died, whatever a caller's ``alive`` (or a record's start
    time) says: a failed agent request alone never does (the agent may be busy or the
    guest hung while QEMU runs). For a backend whose QEMU names no such socket
    (libvirt's), the backend's own answer, on the full record."""
    from hpcvm.procs import pid_alive

    vm = handle_of(machine)
    if vm.pid is None or not vm.agent_socket:
        return False
    if not pid_alive(vm.pid):  # a zombie is gone; its Popen, if any, reaps it
        return False
    try:
        cmdline = Path(f"/proc/{vm.pid}/cmdline").read_bytes()
    except OSError:
        return False
    if vm.agent_socket.encode() in cmdline:
        return True
    full = vm.machine() if isinstance(machine, VmHandle) else machine
    return full is not None and _default_alive(full)


def exec_in(
    machine: VM,
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
