"""Stopping VMs: ``down`` (by name), ``stop`` (from a record: the guest asked to power
off, then QMP quit, then a kill), and ``teardown`` (at once, whatever state the VM is in:
what a failed ``up`` uses), each removing what hpcvm made for the VM (its NICs' host
side, its run directory, its hugetlbfs files). Stopping is never cut short by a signal.

The common VM, one of hpcvm's own QEMU backend with no NIC, is stopped from its record
read without pydantic (runtime/machine/record.py; ``stops_light``): its QEMU's liveness
from /proc as that backend asks it of a QEMU another process started, ``quit`` over
QMP's plain socket (runtime/channels/qmp_line.py), the same steps otherwise
(runtime/backends/qemu_process.py). Any other VM (libvirt's, a plugin backend's, one
whose NICs hpcvm must release, a record that reader cannot vouch for) is stopped from
its full record, through its backend. So ``hpcvm down`` imports the models only for
those (issue 37).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hpcvm.errors import HpcvmError, RuntimeFailure, UsageError
from hpcvm.runtime.backends import qemu_process
from hpcvm.runtime.backends.registry import get_backend, own_process
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.record import VmRecord, read_record
from hpcvm.runtime.machine.timeouts import DOWN_TIMEOUT
from hpcvm.signals import signals_deferred

if TYPE_CHECKING:  # the models load only where a VM needs them (module doc)
    from hpcvm.runtime.machine.model import Backend, Machine


def stops_light(record: VmRecord) -> bool:
    """Whether ``record``'s VM is stopped without its full record (module doc)."""
    return own_process(record.backend) and not record.nics


def down(name: str, timeout: float = DOWN_TIMEOUT) -> None:
    """Stop VM ``name``: guest shutdown, then QMP quit, then SIGKILL; remove its files."""
    directory = paths.run_dir(name)
    if not directory.exists():
        raise UsageError(f"no VM named {name!r}; `hpcvm ps` lists them")
    record = read_record(directory)
    if record is not None and record.pid is not None and stops_light(record):
        stop(record, timeout=timeout)
        return
    entry = state.entry_for(directory)
    if entry.machine is None or entry.machine.pid is None:
        # never recorded as started: QEMU's own pidfile may still name a live QEMU
        kill_unrecorded_qemu(entry)
        if entry.machine is not None:
            release_nics(entry.machine)
        state.clean_stale(entry)
        return
    stop(entry.machine, timeout=timeout)


def stop(machine: Machine | VmRecord, timeout: float = DOWN_TIMEOUT) -> None:
    """Stop a VM from its record: polite first, forceful after ``timeout``. A record
    read without pydantic that ``stops_light`` refuses is stopped from its full one."""
    if isinstance(machine, VmRecord):
        if stops_light(machine):
            _stop_own_qemu(machine, timeout)
            return
        full = state.read_machine(Path(machine.run_dir))
        if full is None:
            raise RuntimeFailure(f"the record of VM {machine.name} cannot be read any more")
        machine = full
    backend = get_backend(machine.backend, machine.connect_uri)
    with signals_deferred():
        if backend.alive(machine):
            _guest_shutdown(machine.boot.agent_socket, lambda: backend.alive(machine), timeout / 2)
        backend.stop(machine, timeout=timeout / 2)
        release_nics(machine)
        state.remove_run_dir(Path(machine.run_dir), machine.hugetlbfs_dirs)


def _stop_own_qemu(vm: VmRecord, timeout: float) -> None:
    """``stop`` of a VM that ``stops_light`` accepts: what the QEMU backend does
    (runtime/backends/qemu_backend.py ``stop``), QEMU's liveness asked of /proc as that
    backend asks it of a QEMU another process started; no NIC to release."""
    from hpcvm.runtime.channels import qmp_line

    def alive() -> bool:
        return state.machine_process_alive(vm)[0]

    def quit(seconds: float) -> object:
        if not vm.qmp_socket:
            raise RuntimeFailure(f"VM {vm.name} has no QMP socket in its record")
        return qmp_line.execute(vm.qmp_socket, "quit", timeout=seconds)

    with signals_deferred():
        if alive():
            _guest_shutdown(vm.agent_socket, alive, timeout / 2)
        qemu_process.stop(vm.pid, vm.sockets, timeout=timeout / 2, alive=alive, quit=quit)
        state.remove_run_dir(Path(vm.run_dir), vm.hugetlbfs_dirs)


def _guest_shutdown(agent_socket: str | None, alive: Callable[[], bool], timeout: float) -> None:
    """Ask the guest to power off and wait for QEMU to exit (errors only logged away)."""
    from hpcvm.runtime.channels.agent import GuestAgent

    if not agent_socket or not Path(agent_socket).exists():
        return
    agent = GuestAgent(agent_socket, timeout=min(5.0, timeout))
    try:
        agent.shutdown()
    except (HpcvmError, OSError):
        return
    finally:
        agent.close()
    qemu_process.wait_gone(None, timeout, lambda _: alive())


def teardown(machine: Machine, backend: Backend | None = None, *, keep_logs: bool = False) -> None:
    """Remove a VM at once, whatever state it is in (used when ``up`` fails). With
    ``keep_logs`` its console and QEMU logs survive (paths.kept_log), because the error
    that made ``up`` fail names them."""
    backend = backend or get_backend(machine.backend, machine.connect_uri)
    # The record on disk may know the pid when ``machine`` (an earlier copy) does not.
    on_disk = state.read_machine(Path(machine.run_dir))
    current = on_disk if on_disk is not None and on_disk.pid is not None else machine
    with contextlib.suppress(HpcvmError):
        backend.stop(current, timeout=2.0)
    with contextlib.suppress(HpcvmError):
        release_nics(machine)
    if keep_logs:
        state.keep_failed_logs(Path(machine.run_dir), machine.name)
    state.remove_run_dir(Path(machine.run_dir), machine.hugetlbfs_dirs)


def release_nics(machine: Machine) -> None:
    """What hpcvm made for the NICs and QEMU does not take with it (a macvtap link)."""
    from hpcvm.runtime.net import network

    backend = get_backend(machine.backend, machine.connect_uri)
    network.release_nics(machine.boot.nics, by_daemon=backend.nics_by_daemon)


def kill_unrecorded_qemu(entry: state.Entry) -> None:
    """A VM whose ``up`` was killed outright (SIGKILL: Slurm's KillWait, srun aborting a
    step) between starting QEMU and recording its pid: QEMU's own pidfile names it. Killed
    only when that process is this VM's QEMU (``-name guest=NAME,``), never a pid the
    kernel has since given to another process."""
    try:
        pid = int((entry.run_dir / paths.PID_FILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return
    if f"guest={entry.name},".encode() not in b" ".join(cmdline):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
