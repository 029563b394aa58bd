"""What ``ps`` and ``down`` read of a VM's record, without pydantic: listing VMs and
stopping one are called from scripts and by hand as often as ``exec`` is, and the
models (the plan's, the boot spec's) cost them more than the rest of their work
(docs/performance.md).

A ``VmRecord`` is the fields of ``machine.json`` (runtime/machine/state.py) that a
line of ``ps`` shows and that ``down`` of hpcvm's own QEMU backend uses: QEMU's pid and
start time, the sockets, the plan's profile, vCPUs and memory, the NICs (as recorded,
for ``ps --json``), the hugetlbfs directories. ``read_record`` gives None for a record
that is missing, not JSON, not the keys a ``Machine`` has, or wrong in a field read
here, where pydantic may be stricter or laxer: a caller then asks ``state.read_machine``
(pydantic) and does what it did before, so a record is never refused here that the
models read. The rest of the record (the plan beyond those fields, the boot media) is
not checked: a record damaged only there is listed and stopped as the fields read here
say, where the models refuse it as unreadable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine.handle import VmHandle, json_field, json_optional

if TYPE_CHECKING:
    from hpcvm.runtime.machine.model import Machine

T = TypeVar("T")

# The keys of a Machine record (runtime/machine/model.py): one that has another is not
# this version's (pydantic forbids extra keys), one without the required ones neither.
MACHINE_KEYS = frozenset(
    {"schema_version", "name", "backend", "run_dir", "pid", "started_at", "plan", "boot",
     "image", "connect_uri", "hugetlbfs_dirs", "options", "host"}
)  # fmt: skip
REQUIRED_KEYS = frozenset(
    {"name", "backend", "run_dir", "pid", "started_at", "plan", "boot", "image"}
)


@dataclass(frozen=True)
class VmRecord:
    """A VM as ``ps`` lists it and ``down`` stops it (module doc)."""

    name: str
    run_dir: str
    backend: str
    pid: int | None
    started_at: float
    profile: str
    vcpus: int
    memory_bytes: int
    agent_socket: str | None = None
    qmp_socket: str | None = None
    done_socket: str | None = None
    serial_log: str | None = None
    disk_image: str | None = None
    connect_uri: str | None = None
    hugetlbfs_dirs: tuple[str, ...] = ()
    nics: tuple[dict[str, Any], ...] = ()  # bootspec.Nic as recorded (JSON)

    @property
    def addresses(self) -> tuple[str, ...]:
        """The guest's planned IPv4 addresses, NIC by NIC (those that have one)."""
        return tuple(str(nic["address"]) for nic in self.nics if nic.get("address"))

    @property
    def sockets(self) -> tuple[str, ...]:
        """Its control sockets (QMP, agent, done), those it has."""
        return tuple(s for s in (self.qmp_socket, self.agent_socket, self.done_socket) if s)

    def handle(self) -> VmHandle:
        """What exec's path to its guest agent needs (runtime/machine/handle.py)."""
        return VmHandle(
            name=self.name,
            run_dir=self.run_dir,
            backend=self.backend,
            pid=self.pid,
            agent_socket=self.agent_socket,
            serial_log=self.serial_log,
            connect_uri=self.connect_uri,
        )


def record_of(machine: Machine) -> VmRecord:
    """``machine``'s fields as a ``VmRecord``: one code for lines of ``ps`` from both."""
    boot = machine.boot
    return VmRecord(
        name=machine.name,
        run_dir=machine.run_dir,
        backend=machine.backend,
        pid=machine.pid,
        started_at=machine.started_at,
        profile=machine.plan.profile,
        vcpus=machine.plan.vcpus,
        memory_bytes=machine.plan.memory_bytes,
        agent_socket=boot.agent_socket,
        qmp_socket=boot.qmp_socket,
        done_socket=boot.done_socket,
        serial_log=boot.serial_log,
        disk_image=boot.disk_image,
        connect_uri=machine.connect_uri,
        hugetlbfs_dirs=machine.hugetlbfs_dirs,
        nics=tuple(nic.model_dump(mode="json") for nic in boot.nics),  # as recorded
    )


def read_record(run_dir: Path) -> VmRecord | None:
    """The record in ``run_dir``; None when it is missing or this reader cannot vouch
    for it (module doc: ask ``state.read_machine`` then)."""
    try:
        record = json.loads((run_dir / paths.MACHINE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not REQUIRED_KEYS <= record.keys() <= MACHINE_KEYS:
        return None
    plan, boot = record["plan"], record["boot"]
    if not isinstance(plan, dict) or not isinstance(boot, dict):
        return None
    try:
        return VmRecord(
            name=json_field(record, "name", str),
            run_dir=json_field(record, "run_dir", str),
            backend=json_field(record, "backend", str),
            pid=json_optional(record, "pid", int),
            started_at=_seconds(record["started_at"]),
            profile=json_field(plan, "profile", str),
            vcpus=json_field(plan, "vcpus", int),
            memory_bytes=json_field(plan, "memory_bytes", int),
            agent_socket=json_optional(boot, "agent_socket", str),
            qmp_socket=json_optional(boot, "qmp_socket", str),
            done_socket=json_optional(boot, "done_socket", str),
            serial_log=json_optional(boot, "serial_log", str),
            disk_image=json_optional(boot, "disk_image", str),
            connect_uri=json_optional(record, "connect_uri", str),
            hugetlbfs_dirs=_strings(record.get("hugetlbfs_dirs", [])),
            nics=_nics(boot.get("nics", [])),
        )
    except (KeyError, TypeError):
        return None


def _seconds(value: object) -> float:
    """A time in seconds: a JSON number (an integral one reads as an int)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError("started_at")
    return float(value)


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("not a list of strings")
    return tuple(value)


def _nics(value: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TypeError("nics")
    for nic in value:
        json_optional(nic, "address", str)
    return tuple(value)
