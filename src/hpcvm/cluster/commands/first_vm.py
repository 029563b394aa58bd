"""``cluster exec``: a command in the job's first VM, where mpirun starts the ranks on
every VM of the job.

Why apart from commands/control.py: a batch script runs ``cluster exec`` once for each
program of its job, and control.py (up, down, wait, the detached commands) imports the
cluster's models and the runtime's with them. This path reads the record and the
nodes' events with job/view.py, the first VM's record with runtime/machine/record.py,
and talks to its guest agent through runtime/vm/guest_exec.py, so that none of the
models load unless a file is one those readers cannot vouch for, which they hand to
the models (issue 37). The checks that the job is up and that this is its first node
(``check_first``) are control.py's too, on its full records.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from ipaddress import IPv4Network
from typing import TYPE_CHECKING, Any, TypeVar

from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.job import guest_mpi, view
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.procs import pid_alive
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import record as vm_records
from hpcvm.runtime.machine.record import VmRecord, record_of

if TYPE_CHECKING:
    from hpcvm.runtime.machine.exec_result import ExecResult

E = TypeVar("E", bound=view.Said)


def check_first(name: str, batch: str, alive: bool, first: E | None) -> E:
    """``first`` (the job's VM 0's last event) when the job is up (its holder step
    ``alive``, that VM ``ready``) and this process runs on its node, as mpirun must."""
    if not alive or first is None or first.event != "ready":
        raise RuntimeFailure(f"cluster {name} is not up (see hpcvm cluster ps {name})")
    if first.node != get_batch(batch).this_node(os.environ):
        raise UsageError(
            f"run hpcvm cluster exec on {first.node}, the job's first node (its VM runs "
            "mpirun), as a batch script does"
        )
    return first


def first_vm(name: str) -> tuple[view.RecordView, view.EventView]:
    """The record and the first node's ``ready`` event, checked (``check_first``)."""
    record = read_record(name)
    alive = pid_alive(record.holder_pid)
    latest = view.latest_per_node(view.events(name, judge=by_the_model))
    return record, check_first(name, record.batch, alive, latest.get(0))


def read_record(name: str) -> view.RecordView:
    """job/state.py ``read_record``, its model loaded only for a record job/view.py
    cannot vouch for (which the model then refuses as before, or reads)."""
    text = view.record_path(name).read_text()
    found = view.record_view(text)
    if found is not None:
        return found
    from hpcvm.cluster.job.state import ClusterRecord

    full = ClusterRecord.model_validate_json(text)
    return view.RecordView(full.name, full.batch, full.holder_pid, full.network)


def by_the_model(data: dict[str, Any]) -> view.EventView | None:
    """An event line job/view.py cannot vouch for, as the model reads it (job/spec.py
    ``parse_events``); None when the model refuses it."""
    from pydantic import ValidationError

    from hpcvm.cluster.job.spec import NodeEvent

    try:
        event = NodeEvent.model_validate(data)
    except ValidationError:
        return None
    return view.EventView(event.event, event.node, event.index, event.vm)


def vm_record(name: str, event: view.EventView) -> VmRecord:
    """The record of a node's VM that runs on this node; the models read one that
    runtime/machine/record.py cannot vouch for."""
    from hpcvm.runtime.machine import state

    run_dir = paths.run_dir(event.vm)
    found = vm_records.read_record(run_dir)
    if found is not None:
        return found
    machine = state.read_machine(run_dir)
    if machine is None:
        raise RuntimeFailure(f"VM {event.vm} of cluster {name} is gone from this node")
    return record_of(machine)


def first_argv(disk_image: str | None, argv: Sequence[str], workdir: str) -> list[str]:
    """``argv`` as the first VM runs it: in the job's directory where the guest shares
    it (the built-in guest), as is in a disk-image guest (which has its own files)."""
    if disk_image is not None:
        return ["/usr/bin/env", *argv]
    return ["/usr/bin/env", "-C", workdir, *argv]


def exec_first(name: str, argv: Sequence[str], workdir: str, timeout: float | None) -> ExecResult:
    """Run ``argv`` in the first node's VM, with the MPI environment that spreads its
    ranks over every VM of the job."""
    from hpcvm.runtime.vm.guest_exec import exec_in

    record, first = first_vm(name)
    vm = vm_record(name, first)
    env = guest_mpi.mpi_environment(IPv4Network(record.network))
    return exec_in(vm.handle(), first_argv(vm.disk_image, argv, workdir), timeout, env=env)
