"""What VMs this user has (``hpcvm ps``): one line each from its record and its QEMU,
and the records of VMs whose QEMU is gone cleaned on the way (what their backend made,
their NICs' host side, their run directory). A VM whose owning hpcvm process died
without taking it down (runtime/machine/state.py ``Owner``) is "orphaned", its note naming the
owner; ``running_vms`` lists them for ``down --orphans``.

A VM of hpcvm's own QEMU backend that is not stale is listed from its record read
without pydantic (runtime/machine/record.py), its QEMU asked over QMP's plain socket
whether its vCPUs run (runtime/channels/qmp_line.py), as the backend asks it; so is it
found for ``down --all`` when ``down`` can stop it so (runtime/vm/stopping.py
``stops_light``). Any other VM (a stale one, which is cleaned through its backend,
another backend's, a record that reader cannot vouch for) is read into the models as
before. So ``ps`` and ``down`` load them only for such VMs (issue 37).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcvm.errors import HpcvmError
from hpcvm.runtime.backends.registry import own_process
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.record import VmRecord, read_record, record_of
from hpcvm.runtime.vm.stopping import stops_light

if TYPE_CHECKING:  # the models load only where a VM needs them (module doc)
    from hpcvm.runtime.machine.model import Machine


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
    for run_dir in state.vm_dirs():
        light = _own_qemu(run_dir)
        if light is not None and light.machine is not None and light.state != "stale":
            live = _qemu_status(light.machine) if light.state == "running" else None
            out.append(_line(light, light.machine, live, clean))
            continue
        entry = state.entry_for(run_dir)
        m = entry.machine
        if entry.state == "stale" and clean:
            clean_stale(entry)
        live = _live_status(m) if entry.state == "running" and m is not None else None
        out.append(_line(entry, record_of(m) if m else None, live, clean))
    return out


def _own_qemu(run_dir: Path) -> state.EntryOf[VmRecord] | None:
    """``run_dir``'s entry from its record read without pydantic, for a VM of hpcvm's
    own QEMU backend; None for any other (module doc)."""
    record = read_record(run_dir)
    if record is None or not own_process(record.backend):
        return None
    return state.classify(run_dir, record)


def _line(
    entry: state.EntryOf[Any], vm: VmRecord | None, live: str | None, clean: bool
) -> VmStatus:
    """``entry``'s line of ``ps``; ``live``: its backend's word on a running VM."""
    status: str = entry.state
    note = ""
    if entry.state == "stale":
        note = f"{entry.reason}; cleaned" if clean else entry.reason
    elif live is not None:
        status = live
        if entry.orphaned and entry.owner is not None:
            note = f"{status}; its owner {entry.owner.describe()} is gone"
            status = "orphaned"
    return VmStatus(
        name=entry.name,
        backend=vm.backend if vm else "?",
        state=status,
        pid=vm.pid if vm else None,
        uptime=state.uptime(vm) if vm and entry.state != "stale" else None,
        profile=vm.profile if vm else None,
        vcpus=vm.vcpus if vm else None,
        memory_bytes=vm.memory_bytes if vm else None,
        note=note,
        addresses=vm.addresses if vm else (),
        nics=vm.nics if vm else (),
        owner=entry.owner.describe() if entry.owner else "",
    )


def clean_stale(entry: state.Entry) -> None:
    """Let the backend remove what it made (sockets, a libvirt definition), then the
    run dir and hugetlbfs directories."""
    from hpcvm.runtime.backends.registry import get_backend
    from hpcvm.runtime.vm.stopping import kill_unrecorded_qemu, release_nics

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
    from hpcvm.runtime.backends.registry import get_backend

    backend = get_backend(machine.backend, machine.connect_uri)
    try:
        return backend.status(machine)
    except HpcvmError:
        return "running"


def _qemu_status(vm: VmRecord) -> str:
    """``_live_status`` of a VM of hpcvm's QEMU backend: its ``status`` (QMP
    query-status), over QMP's plain socket."""
    from hpcvm.runtime.channels import qmp_line

    if not vm.qmp_socket:
        return "running"  # the backend refuses a record without a QMP socket
    try:
        result = qmp_line.execute(vm.qmp_socket, "query-status", timeout=5.0)
    except HpcvmError:
        return "running"
    return "running" if result.get("running") else "paused"


def running_vms(*, orphaned: bool = False) -> list[Machine | VmRecord]:
    """The VMs whose QEMU runs, for ``down --all`` (with ``orphaned``: those whose
    owning process is gone, for ``down --orphans``): those ``down`` stops without the
    models as records read without pydantic (module doc), the others as full records."""
    out: list[Machine | VmRecord] = []
    for run_dir in state.vm_dirs():
        light = _own_qemu(run_dir)
        entry: state.EntryOf[Any] = (
            light
            if light is not None and light.machine is not None and stops_light(light.machine)
            else state.entry_for(run_dir)
        )
        if (entry.orphaned if orphaned else entry.state == "running") and entry.machine:
            out.append(entry.machine)
    return out


def running_machines() -> list[Machine]:
    """Full records of the VMs whose QEMU runs (the checkpoint benchmarks')."""
    return [e.machine for e in state.list_entries() if e.state == "running" and e.machine]
