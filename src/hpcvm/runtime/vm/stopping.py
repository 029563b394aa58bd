"""Stopping VMs: ``down`` (by name), ``stop`` (from a record: the guest asked to power
off, then QMP quit, then a kill), and ``teardown`` (at once, whatever state the VM is in:
what a failed ``up`` uses), each removing what hpcvm made for the VM (its NICs' host
side, its run directory, its hugetlbfs files). Stopping is never cut short by a signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from hpcvm.errors import HpcvmError, UsageError
from hpcvm.runtime.backends.registry import get_backend
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Backend, Machine
from hpcvm.runtime.machine.timeouts import DOWN_TIMEOUT
from hpcvm.runtime.net import network
from hpcvm.signals import signals_deferred


def down(name: str, timeout: float = DOWN_TIMEOUT) -> None:
    """Stop VM ``name``: guest shutdown, then QMP quit, then SIGKILL; remove its files."""
    directory = paths.run_dir(name)
    entry = state.entry_for(directory) if directory.exists() else None
    if entry is None:
        raise UsageError(f"no VM named {name!r}; `hpcvm ps` lists them")
    if entry.machine is None or entry.machine.pid is None:
        # never recorded as started: QEMU's own pidfile may still name a live QEMU
        kill_unrecorded_qemu(entry)
        if entry.machine is not None:
            release_nics(entry.machine)
        state.clean_stale(entry)
        return
    stop(entry.machine, timeout=timeout)


def stop(machine: Machine, timeout: float = DOWN_TIMEOUT) -> None:
    """Stop a VM from its record: polite first, forceful after ``timeout``."""
    backend = get_backend(machine.backend, machine.connect_uri)
    with signals_deferred():
        if backend.alive(machine):
            _guest_shutdown(machine, backend, timeout / 2)
        backend.stop(machine, timeout=timeout / 2)
        release_nics(machine)
        state.remove_run_dir(Path(machine.run_dir), machine.hugetlbfs_dirs)


def _guest_shutdown(machine: Machine, backend: Backend, timeout: float) -> None:
    """Ask the guest to power off and wait for QEMU to exit (errors only logged away)."""
    from hpcvm.runtime.backends.qemu_backend import wait_gone
    from hpcvm.runtime.channels.agent import GuestAgent

    if not machine.boot.agent_socket or not Path(machine.boot.agent_socket).exists():
        return
    agent = GuestAgent(machine.boot.agent_socket, timeout=min(5.0, timeout))
    try:
        agent.shutdown()
    except (HpcvmError, OSError):
        return
    finally:
        agent.close()
    wait_gone(machine, timeout, backend.alive)


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
