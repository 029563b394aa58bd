"""``cluster exec --detach`` and ``cluster wait``: a command started in the job's first
VM that outlives the command line (and a checkpoint and restore of the job), its result
kept by the guest agent until it is collected once, and its entry in the job's record.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from ipaddress import IPv4Network
from typing import TYPE_CHECKING

from hpcvm.cluster.commands import control
from hpcvm.cluster.commands.first_vm import first_argv
from hpcvm.cluster.job import guest_mpi, state
from hpcvm.cluster.job.checkpoint_model import DetachedExec
from hpcvm.cluster.job.state import ClusterRecord
from hpcvm.errors import BusyError, RuntimeFailure, UsageError
from hpcvm.runtime.machine.model import ExecResult, Machine
from hpcvm.signals import signals_deferred

if TYPE_CHECKING:
    from hpcvm.runtime.channels.agent import GuestAgent


def _argv(machine: Machine, argv: Sequence[str], workdir: str) -> list[str]:
    """``argv`` as the first VM runs it (commands/first_vm.py ``first_argv``)."""
    return first_argv(machine.boot.disk_image, argv, workdir)


def exec_detached(name: str, argv: Sequence[str], workdir: str) -> DetachedExec:
    """Start ``argv`` in the first VM as ``cluster exec`` does and return at once: its
    output and exit status stay in the guest (qemu-ga) until ``wait_detached`` collects
    them, across a checkpoint and restore of the job."""
    from hpcvm.runtime.vm.guest_exec import connected

    with state.one_writer(name):
        record, first = control.first_vm(name)
        machine = control.vm_of(name, first)
        env = guest_mpi.mpi_environment(IPv4Network(record.network))
        with connected(machine) as agent:
            pid = agent.spawn(_argv(machine, argv, workdir), env=env)
        started = DetachedExec(pid=pid, argv=tuple(argv), started_at=time.time())
        state.write_record(record.model_copy(update={"detached": (*record.detached, started)}))
    return started


WAIT_POLL = 0.5  # seconds between asks whether a detached command has ended


def wait_detached(
    name: str,
    pid: int | None,
    timeout: float | None,
    report: Callable[[ExecResult], None],
    meanwhile: Callable[[], None] | None = None,
) -> ExecResult:
    """Until the detached command ``pid`` (the only one when None) ends; then
    ``report(result)``, its output and exit status. qemu-ga tells an ended command's
    result once and then forgets it: a SIGTERM or Ctrl-C that arrives between asking
    and reporting waits until the result is reported. ``meanwhile`` runs between asks
    (the CLI says the job's periodic checkpoints there as they happen)."""
    from hpcvm.runtime.vm.guest_exec import ExecTimeout, connected

    record, first = control.first_vm(name)
    chosen = _detached(record, pid)
    machine = control.vm_of(name, first)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            with connected(machine) as agent:
                return _wait_on(agent, name, chosen, (deadline, timeout), report, meanwhile)
        except RuntimeFailure as exc:
            if isinstance(exc, ExecTimeout) or not state.keeper_working(name):
                raise
            time.sleep(WAIT_POLL)  # the keeper stood the VMs still to save them: ask again


def _wait_on(
    agent: GuestAgent,
    name: str,
    chosen: DetachedExec,
    limit: tuple[float | None, float | None],
    report: Callable[[ExecResult], None],
    meanwhile: Callable[[], None] | None,
) -> ExecResult:
    """``wait_detached`` on one connection to the first VM's agent."""
    from hpcvm.runtime.vm.guest_exec import ExecTimeout

    deadline, timeout = limit
    while True:
        with signals_deferred():
            result = agent.exit_status(chosen.pid)
            if result is not None:
                report(result)
                _forget(name, chosen.pid)
                return result
        if meanwhile is not None:
            meanwhile()
        if deadline is not None and time.monotonic() > deadline:
            raise ExecTimeout(
                f"command {chosen.pid} ({' '.join(chosen.argv)}) still runs after "
                f"{timeout:g} s; wait again later"
            )
        time.sleep(WAIT_POLL)


def _forget(name: str, pid: int) -> None:
    """Drop a collected command from the record; when another command holds the
    record's lock (a checkpoint), the stale entry stays: asking for it again says qemu-ga
    no longer knows it."""
    with contextlib.suppress(BusyError), state.one_writer(name):
        record = state.read_record(name)
        left = tuple(d for d in record.detached if d.pid != pid)
        state.write_record(record.model_copy(update={"detached": left}))


def _detached(record: ClusterRecord, pid: int | None) -> DetachedExec:
    if pid is None and len(record.detached) == 1:
        return record.detached[0]
    found = [d for d in record.detached if d.pid == pid]
    if found:
        return found[0]
    known = ", ".join(f"{d.pid} ({' '.join(d.argv)})" for d in record.detached) or "none"
    what = f"no detached command {pid}" if pid is not None else "say which command"
    raise UsageError(f"cluster {record.name}: {what}; its detached commands: {known}")
