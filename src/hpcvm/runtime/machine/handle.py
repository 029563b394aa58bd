"""What it takes to reach a running VM's guest agent, read from its record without
pydantic: the commands a script calls in a loop (``exec``) pay for the interpreter,
click and a socket, not for the plan's models.

A ``VmHandle`` is the few fields of ``machine.json`` (runtime/machine/state.py) that
``exec`` needs: where the agent's socket and the console log are, QEMU's pid, the
backend. ``read_handle`` refuses, in ``state.load_machine``'s line, a name no VM may
have, a runtime root another user could reach into (runtime/hostside/paths.py), and a
record that is missing, not JSON, or wrong in one of these fields; it does not check
the rest of the record (its plan, its boot media), which exec does not read.
``handle_of`` gives the handle of a full ``Machine``, so that runtime/vm/guest_exec.py
serves both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hpcvm.errors import UsageError
from hpcvm.runtime.hostside import paths

if TYPE_CHECKING:
    from hpcvm.runtime.machine.model import Machine

T = TypeVar("T")


@dataclass(frozen=True)
class VmHandle:
    """A VM as its guest agent's clients see it (module doc)."""

    name: str
    run_dir: str
    backend: str
    pid: int | None
    agent_socket: str | None
    serial_log: str | None
    connect_uri: str | None = None

    def machine(self) -> Machine | None:
        """The full record, for what only it answers (a libvirt VM's liveness); None
        when it is gone or unreadable meanwhile."""
        from hpcvm.runtime.machine.state import read_machine

        return read_machine(Path(self.run_dir))


def handle_of(vm: Machine | VmHandle) -> VmHandle:
    """``vm``'s handle (itself when it is one)."""
    if isinstance(vm, VmHandle):
        return vm
    return VmHandle(
        name=vm.name,
        run_dir=vm.run_dir,
        backend=vm.backend,
        pid=vm.pid,
        agent_socket=vm.boot.agent_socket,
        serial_log=vm.boot.serial_log,
        connect_uri=vm.connect_uri,
    )


def read_handle(name: str) -> VmHandle:
    """The handle of the VM the user named; the one-line error of
    ``state.load_machine`` when there is none."""
    directory = paths.run_dir(name)
    handle = _parse(directory)
    if handle is None:
        raise UsageError(
            f"no VM named {name!r} (runtime dir {paths.runtime_root()}); `hpcvm ps` lists them"
        )
    return handle


def _parse(directory: Path) -> VmHandle | None:
    """The handle in ``directory``'s record; None when it is missing, not JSON, or a
    field has the wrong type (what pydantic would refuse of these fields)."""
    try:
        record = json.loads((directory / paths.MACHINE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(boot := record.get("boot"), dict):
        return None
    try:
        return VmHandle(
            name=json_field(record, "name", str),
            run_dir=json_field(record, "run_dir", str),
            backend=json_field(record, "backend", str),
            pid=json_optional(record, "pid", int),
            agent_socket=json_optional(boot, "agent_socket", str),
            serial_log=json_optional(boot, "serial_log", str),
            connect_uri=json_optional(record, "connect_uri", str),
        )
    except (KeyError, TypeError):
        return None


def json_field(record: dict[str, Any], key: str, kind: type[T]) -> T:
    """``record[key]``, of type ``kind`` exactly as JSON gives it (a bool is no int);
    KeyError or TypeError otherwise. Shared by the readers of a record that need no
    pydantic (this module, runtime/machine/record.py)."""
    value = record[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(key)
    return value


def json_optional(record: dict[str, Any], key: str, kind: type[T]) -> T | None:
    """``record[key]`` as ``json_field`` reads it, or None where it is absent or null."""
    return None if record.get(key) is None else json_field(record, key, kind)
