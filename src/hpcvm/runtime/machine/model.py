"""What a running VM is, as the runtime records it.

``Machine`` is persisted as ``<run_dir>/machine.json`` in the VM's own runtime
directory (0700) so that ``ps``, ``exec``, ``verify`` and ``down`` — separate processes
— find it again. The plan and boot spec are kept whole: ``verify`` compares the running
VM with exactly what was planned.
"""

from __future__ import annotations

from typing import Any, Protocol

from hpcvm.bootspec import BootSpec
from hpcvm.model import Frozen
from hpcvm.plan.model import VMPlan
from hpcvm.runtime.hostside.confine import QemuUser
from hpcvm.runtime.machine.exec_result import ExecResult as ExecResult
from hpcvm.runtime.machine.options import VmOptions

MACHINE_SCHEMA_VERSION = 1


class Machine(Frozen):
    """One VM started by hpcvm."""

    schema_version: int = MACHINE_SCHEMA_VERSION
    name: str
    backend: str  # a name in runtime/backends/registry.py BACKENDS
    run_dir: str  # absolute; holds machine.json, sockets, logs
    pid: int | None  # QEMU's pid (both backends: libvirt's QEMU too)
    started_at: float  # time.time() when QEMU was started
    plan: VMPlan
    boot: BootSpec
    image: str  # "builtin:<kernel version>" or the disk image path
    connect_uri: str | None = None  # libvirt connection URI (libvirt backend)
    hugetlbfs_dirs: tuple[str, ...] = ()  # where QEMU's hugetlbfs files live (cleanup)
    options: VmOptions | None = None  # how it was booted (a checkpoint restores it so)
    # the host it runs on (its hostname): a runtime directory another host can see (a
    # shared file system, the one-machine test cluster's nodes) does not make its VMs
    # this host's; "" in records written before it was kept
    host: str = ""


class Backend(Protocol):
    """Starts and stops VMs; QEMU (QMP) and libvirt implement it.

    The runtime (runtime/vm/lifecycle.py) drives a backend; a backend knows nothing about
    the guest agent, state files or the CLI. What differs between backends is said by
    its traits, read as attributes, never by its name.
    """

    name: str
    pins_itself: bool  # it pins vCPU and emulator threads (libvirt's cputune); else hpcvm
    opens_shares_as_root: bool  # QEMU opens shares before dropping to its user (-runas)
    confines_itself: bool  # it drops QEMU's privileges and sandboxes it (libvirt); else
    #                        hpcvm adds -runas and -sandbox to QEMU's command line
    private_hugetlbfs: bool  # hpcvm gives each VM its own hugetlbfs directory (cleanup)
    nics_by_daemon: bool  # a privileged daemon makes and removes the host-side NICs

    def qemu_user(self) -> QemuUser:
        """Who this backend's QEMU runs as (never root; runtime/hostside/confine.py)."""
        ...

    def start(self, machine: Machine) -> Machine:
        """Start QEMU for ``machine`` (pid unset) and return it with the pid set.

        Raises RuntimeFailure with QEMU's exit code and log tail if it dies early.
        """
        ...

    def vcpu_threads(self, machine: Machine) -> dict[int, int]:
        """vCPU index -> host thread id (from QMP query-cpus-fast)."""
        ...

    def alive(self, machine: Machine) -> bool: ...

    def qmp(
        self, machine: Machine, command: str, arguments: dict[str, object] | None = None
    ) -> Any:
        """One QMP command to QEMU and its return value (its own socket, or through
        libvirt, which owns the socket); RuntimeFailure when QEMU refuses it."""
        ...

    def status(self, machine: Machine) -> str:
        """``running`` or ``paused``, as the backend sees it."""
        ...

    def exit_code(self, machine: Machine) -> int | None:
        """QEMU's exit code once it exited, where the backend knows it (None otherwise)."""
        ...

    def death_message(self, machine: Machine) -> str:
        """One line for a QEMU that died: how, and the tail of its log."""
        ...

    def pause(self, machine: Machine) -> None: ...

    def resume(self, machine: Machine) -> None: ...

    def stop(self, machine: Machine, *, timeout: float) -> None:
        """Make QEMU exit (QMP quit / libvirt destroy), kill after ``timeout``, and
        remove what the backend created (domain definition, sockets)."""
        ...
