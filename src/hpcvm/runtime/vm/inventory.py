"""What VMs this user has (``hpcvm ps``): one line each from its record and its QEMU,
and the records of VMs whose QEMU is gone cleaned on the way (what their backend made,
their NICs' host side, their run directory). A VM whose owning hpcvm process died
without taking it down (runtime/machine/state.py ``Owner``) is "orphaned", its note naming the
owner; ``orphaned_machines`` lists them for ``down --orphans``."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from hpcvm.errors import HpcvmError
from hpcvm.runtime.backends.registry import get_backend
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.vm.stopping import kill_unrecorded_qemu, release_nics


@dataclass(frozen=True)
class VmStatus:
    """One line of ``ps``."""

    name: str
    backend: str
    state: str  # running, paused, starting, stale, orphaned
    pid: int | None
    uptime: float | None
    profile: str | None
    vcpus: int | None
    memory_bytes: int | None
    note: str = ""
    addresses: tuple[str, ...] = ()  # the guest's planned IPv4 addresses (--address)
    nics: tuple[dict[str, object], ...] = ()  # bootspec.Nic as JSON, for `ps --json`
    owner: str = ""  # the process it lives with ("pid 412 (hpcvm bench)"); "" for none


def list_vms(*, clean: bool = True) -> list[VmStatus]:
    """Every VM under the runtime root; stale ones are reported and (by default) removed."""
    out: list[VmStatus] = []
    for entry in state.list_entries():
        m = entry.machine
        status: str = entry.state
        note = ""
        if entry.state == "stale":
            note = f"{entry.reason}; cleaned" if clean else entry.reason
            if clean:
                clean_stale(entry)
        elif entry.state == "running" and m is not None:
            status = _live_status(m)
            if entry.orphaned and entry.owner is not None:
                note = f"{status}; its owner {entry.owner.describe()} is gone"
                status = "orphaned"
        out.append(
            VmStatus(
                name=entry.name,
                backend=m.backend if m else "?",
                state=status,
                pid=m.pid if m else None,
                uptime=state.uptime(m) if m and entry.state != "stale" else None,
                profile=m.plan.profile if m else None,
                vcpus=m.plan.vcpus if m else None,
                memory_bytes=m.plan.memory_bytes if m else None,
                note=note,
                addresses=tuple(n.address for n in m.boot.nics if n.address) if m else (),
                nics=tuple(n.model_dump() for n in m.boot.nics) if m else (),
                owner=entry.owner.describe() if entry.owner else "",
            )
        )
    return out


def clean_stale(entry: state.Entry) -> None:
    """Let the backend remove what it made (sockets, a libvirt definition), then the
    run dir and hugetlbfs directories."""
    if entry.machine is not None:
        with contextlib.suppress(HpcvmError):
            get_backend(entry.machine.backend, entry.machine.connect_uri).stop(
                entry.machine, timeout=2.0
            )
        with contextlib.suppress(HpcvmError):
            release_nics(entry.machine)
    else:
        kill_unrecorded_qemu(entry)
    state.clean_stale(entry)


def _live_status(machine: Machine) -> str:
    backend = get_backend(machine.backend, machine.connect_uri)
    try:
        return backend.status(machine)
    except HpcvmError:
        return "running"


def running_machines() -> list[Machine]:
    """Records of the VMs whose QEMU runs (for ``down --all`` and ``bench``)."""
    return [e.machine for e in state.list_entries() if e.state == "running" and e.machine]


def orphaned_machines() -> list[Machine]:
    """Records of running VMs whose owning process is gone (``down --orphans``)."""
    return [e.machine for e in state.list_entries() if e.orphaned and e.machine]
