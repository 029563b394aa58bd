"""Ending a QEMU of hpcvm's own backend: asked to quit over QMP, killed once ``timeout``
passed, its agent relay ended, its control sockets removed.

Why apart from runtime/backends/qemu_backend.py: ``QemuBackend.stop`` does this on a
full record (the models, and QMP's asyncio client), and ``hpcvm down`` does it on a
record read without pydantic (runtime/vm/stopping.py, runtime/machine/record.py), so
that stopping a VM costs no model imports (issue 37). Both give what differs as
callables: whether QEMU still runs (a ``Popen`` the backend holds, or /proc), how
``quit`` is sent (qmp.py or qmp_line.py), what the backend forgets of the process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.channels import agent_relay
from hpcvm.runtime.hostside import paths

POLL = 0.01  # seconds between looks whether QEMU exited
KILL_WAIT = 30.0  # seconds a SIGKILLed QEMU may take to go
QUIT_TIMEOUT = 5.0  # at most, for QMP's quit to be answered

M = TypeVar("M")


def wait_gone(machine: M, timeout: float, alive: Callable[[M], bool]) -> bool:
    """Poll until ``alive(machine)`` is false; True when it went within ``timeout``."""
    deadline = time.monotonic() + timeout
    while alive(machine):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL)
    return True


def stop(
    pid: int | None,
    sockets: Sequence[str | None],
    *,
    timeout: float,
    alive: Callable[[], bool],
    quit: Callable[[float], object],
    forget: Callable[[], None] = lambda: None,
) -> None:
    """QMP quit (``quit(seconds)``, a RuntimeFailure ignored), then SIGKILL after
    ``timeout``; then end the agent's relay and remove the ``sockets``."""
    if alive():
        with contextlib.suppress(RuntimeFailure):
            quit(min(QUIT_TIMEOUT, timeout))
        if not wait_gone(None, timeout, lambda _: alive()):
            kill(pid, alive=alive, forget=forget)
    forget()
    for sock in sockets:
        end_relay(sock)
        if sock:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sock)


def end_relay(agent_socket: str | None) -> None:
    """Once QEMU is gone: wait for the agent's relay beside ``agent_socket`` to end (it
    does on QEMU's end of file) and remove its files; nothing for another socket."""
    relay = paths.agent_relay(agent_socket) if agent_socket else None
    if relay is not None:
        agent_relay.ended(relay)


def kill(pid: int | None, *, alive: Callable[[], bool], forget: Callable[[], None]) -> None:
    """SIGKILL QEMU (only while ``alive`` says the pid is still this VM's QEMU) and
    wait for it to go."""
    if pid is not None and alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not wait_gone(None, KILL_WAIT, lambda _: alive()):
            raise RuntimeFailure(f"QEMU pid {pid} survived SIGKILL for 30 s", cause="qemu")
    forget()
