"""``cluster up``, ``ps``, ``exec`` and ``down``: the orchestration, on the job's batch
node.

``up`` asks the batch system (batch.py) for the allocation and starts the holder step
through the holder (holder.py) in its own session, so that it outlives the ``hpcvm``
process that started it and ends only with the step; its output goes to the cluster's
log (state.py), where the nodes' event lines arrive and the other commands read them.
Nothing here knows which batch system it is: the record names it, and every call goes
through its interface.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from ipaddress import IPv4Interface, IPv4Network
from pathlib import Path

from hpcvm import timeline
from hpcvm.cluster import guest_mpi, state
from hpcvm.cluster.addresses import AUTO
from hpcvm.cluster.batch import Allocation, BatchSystem
from hpcvm.cluster.batches import get_batch
from hpcvm.cluster.spawn import internal_argv
from hpcvm.cluster.spec import (
    SPEC_ENV,
    ClusterRequest,
    ClusterSpec,
    NodeEvent,
    check_addresses,
    latest_per_node,
)
from hpcvm.cluster.state import ClusterRecord
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.runtime import paths
from hpcvm.runtime import state as vm_state
from hpcvm.runtime.model import ExecResult, Machine
from hpcvm.runtime.shares import check_job_dir
from hpcvm.signals import signals_deferred

DOWN_WAIT = 60.0  # seconds for every node to report its VM down
LOG_TAIL = 20
POLL = 0.05  # seconds between reads of the holder log for new events


def step_name(cluster: str) -> str:
    """The holder step's name, by which the batch system finds it again."""
    return f"hpcvm-cluster-{cluster}"


Say = Callable[[str], None]


# -- up ---------------------------------------------------------------------------------


def up(request: ClusterRequest, timeout: float, say: Say) -> list[NodeEvent]:
    """Start the VMs of ``request.name`` on every node of this allocation; return their
    ready events, or raise after taking every VM down again."""
    timeline.mark_process_start("client: process start")
    timeline.mark("client: up entered")
    batch = get_batch(request.batch)
    guest_mpi.require_sshd()
    check_job_dir(request.workdir, request.vm.shares)
    check_workdir(request.workdir, request.vm.backend)
    allocation = batch.allocation(request.nodes, os.environ)
    if request.first_address != AUTO:
        check_addresses(request.first_address, len(allocation.nodes))
    name = request.name
    with state.one_writer(name), state.claimed(name) as directory:
        public, private = state.make_keys(directory, name)
        timeline.mark("client: keys made")
        spec = ClusterSpec.model_validate(
            {
                **request.model_dump(),
                "job_id": allocation.job_id,
                "nodes": len(allocation.nodes),
                "public_key": public,
            }
        )
        holder = _start_holder(batch, allocation, spec, directory)
        timeline.mark("client: holder started")
        record = ClusterRecord(
            name=name,
            batch=batch.name,
            job_id=allocation.job_id,
            nodes=allocation.nodes,
            holder_pid=holder.pid,
            network="",
            vcpus=spec.plan.vcpus,
        )
        state.write_record(record)
        nodes = ", ".join(allocation.nodes)
        say(f"{name}: starting a VM on {len(allocation.nodes)} node(s): {nodes}")
        try:
            ready = _wait_ready(record, holder, timeout, say)
            timeline.mark("client: every node ready")
            state.write_record(_launch_mpi(record, ready, private))
            timeline.mark("client: MPI launcher set")
            return ready
        except BaseException:
            with signals_deferred():
                _take_down(record, holder, say)
            raise


def _launch_mpi(record: ClusterRecord, ready: list[NodeEvent], private_key: str) -> ClusterRecord:
    """Make the first VM (this node's) the job's MPI launcher once every VM reported
    its address: the hostfile of every VM's address with its vCPUs as slots, and the
    job's private key (guest_mpi.py). The record learns the VMs' network."""
    first = next(e for e in ready if e.index == 0)
    addresses = [IPv4Interface(e.address or "") for e in sorted(ready, key=lambda e: e.index)]
    machine = vm_of(record.name, first)
    hosts = [(str(a.ip), record.vcpus) for a in addresses]
    guest_mpi.run_script(machine, guest_mpi.first_vm_script(hosts), private_key, "the MPI hostfile")
    return record.model_copy(update={"network": str(addresses[0].network)})


def vm_of(name: str, event: NodeEvent) -> Machine:
    """The record of a node's VM that runs on this node."""
    entry = vm_state.entry_for(paths.run_dir(event.vm))
    if entry is None or entry.machine is None:
        raise RuntimeFailure(f"VM {event.vm} of cluster {name} is gone from this node")
    return entry.machine


def check_workdir(workdir: str, backend_name: str) -> None:
    """The job's directory is where its programs and inputs are, shared with every guest
    at the same path: refuse before anything starts when QEMU's user cannot read it (a
    lone ``hpcvm up`` only warns and leaves it out)."""
    from hpcvm.runtime.backends import get_backend
    from hpcvm.runtime.confine import can_access

    backend = get_backend(backend_name)
    user = backend.qemu_user()
    by_root = backend.opens_shares_as_root and user.switch
    if not can_access(workdir, user, write=False, opened_by_root=by_root):
        raise UsageError(
            f"the job's directory {workdir} is not readable by {user.name}, the user QEMU "
            f"runs as, so the guests could not run programs from it: allow it (setfacl -m "
            f"u:{user.name}:rx {workdir}) or run the job from a directory it can read"
        )


def _start_holder(
    batch: BatchSystem, allocation: Allocation, spec: ClusterSpec, directory: Path
) -> subprocess.Popen[bytes]:
    step = batch.step_argv(allocation, step_name(spec.name), internal_argv("node"))
    argv = [*internal_argv("holder"), str(directory), *step]
    env = {**os.environ, SPEC_ENV: spec.model_dump_json()}
    with (directory / state.LOG_FILE).open("ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=spec.workdir,
            start_new_session=True,
        )


def _wait_ready(
    record: ClusterRecord, holder: subprocess.Popen[bytes], timeout: float, say: Say
) -> list[NodeEvent]:
    """Until every node reported ``ready`` (its events, read as they arrive), one
    failed, the step ended or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    announced: set[int] = set()
    while True:
        latest = latest_per_node(state.events(record.name))
        for index, event in latest.items():
            if event.event == "ready" and index not in announced:
                announced.add(index)
                say(f"{event.node}: {event.vm} ready at {event.address}")
        bad = [e for e in latest.values() if e.event in ("failed", "died")]
        if bad:
            e = bad[0]
            raise RuntimeFailure(
                f"node {e.node}: {e.message}; every VM of cluster {record.name} is taken down"
                f"{_log_hint(record.name)}"
            )
        ready = [e for e in latest.values() if e.event == "ready"]
        if len(ready) == len(record.nodes):
            return ready
        if holder.poll() is not None:
            raise RuntimeFailure(
                f"the holder step of cluster {record.name} ended (exit {holder.returncode}) "
                f"before every node was ready{_log_hint(record.name)}"
            )
        if time.monotonic() > deadline:
            missing = [n for i, n in enumerate(record.nodes) if i not in announced]
            raise RuntimeFailure(
                f"node(s) {', '.join(missing)} did not report their VM ready within {timeout:g} s"
                f"{_log_hint(record.name)}"
            )
        time.sleep(POLL)


def _log_hint(name: str) -> str:
    lines = state.log_lines(name)[-LOG_TAIL:]
    if not lines:
        return ""
    sys.stderr.write("hpcvm: the nodes' output:\n" + "\n".join(lines) + "\n")
    return " (the nodes' output is above)"


# -- down -------------------------------------------------------------------------------


def _allocation(record: ClusterRecord) -> Allocation:
    return Allocation(batch=record.batch, job_id=record.job_id, nodes=record.nodes)


def _step(record: ClusterRecord, batch: BatchSystem) -> str | None:
    found = next((e.step for e in state.events(record.name) if e.step), None)
    return found or batch.find_step(_allocation(record), step_name(record.name))


def _take_down(
    record: ClusterRecord, holder: subprocess.Popen[bytes] | None, say: Say
) -> list[str]:
    """End the holder step and wait until every node reported its VM down; the nodes
    that did not, by name. The state directory goes in any case."""
    batch = get_batch(record.batch)
    state.mark_taking_down(record.name)  # the holder leaves the directory to us
    # SIGTERM to the step's tasks, which stop their VMs in order. Not to the holder's
    # step command (srun): a signal makes srun abort the step, and its tasks are then
    # killed mid-boot (their reapers clean up, but a VM being started is better stopped
    # by its own task).
    step = _step(record, batch)
    if step is not None:
        batch.signal_step(step, "TERM")
    else:  # no step yet (it still waits for its nodes): ending the holder ends it
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.holder_pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_WAIT
    while time.monotonic() < deadline and _holder_running(record, holder):
        time.sleep(POLL)
    if _holder_running(record, holder):
        if step is not None:
            batch.signal_step(step, None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.holder_pid, signal.SIGKILL)
    latest = latest_per_node(state.events(record.name))
    started = {i for i, e in latest.items() if e.event != "failed"}
    unconfirmed = [
        record.nodes[i] for i in sorted(started) if latest[i].event not in ("down", "died")
    ]
    for i in sorted(started):
        if latest[i].event in ("down", "died"):
            say(f"{record.nodes[i]}: {latest[i].vm} {latest[i].event}")
    state.remove(record.name)
    return unconfirmed


def _holder_running(record: ClusterRecord, holder: subprocess.Popen[bytes] | None) -> bool:
    if holder is not None:
        return holder.poll() is None
    return state.holder_alive(record)


def down(name: str, say: Say) -> None:
    """Take every VM of cluster ``name`` down, on every node."""
    with state.one_writer(name):
        record = state.read_record(name)
        with signals_deferred():
            unconfirmed = _take_down(record, None, say)
    if unconfirmed:
        raise RuntimeFailure(
            f"node(s) {', '.join(unconfirmed)} did not confirm their VM down; the batch "
            "system ended the step, check those nodes with hpcvm ps"
        )


def down_if_up(name: str, say: Say) -> None:
    """``down`` when the cluster still has its record (bench closing its environments)."""
    if state.has_record(name):
        down(name, say)


# -- ps and exec ------------------------------------------------------------------------


def status(name: str) -> tuple[ClusterRecord, list[NodeEvent], bool]:
    """The record, each node's last event, and whether the holder step still runs."""
    record = state.read_record(name)
    alive = state.holder_alive(record)
    return record, list(latest_per_node(state.events(name)).values()), alive


def first_vm(name: str) -> tuple[ClusterRecord, NodeEvent]:
    """The record and the first node's ``ready`` event, checked to be on this node
    (where mpirun runs: ``exec``, bench's runs)."""
    record, latest, alive = status(name)
    first = next((e for e in latest if e.index == 0), None)
    if not alive or first is None or first.event != "ready":
        raise RuntimeFailure(f"cluster {name} is not up (see hpcvm cluster ps {name})")
    if first.node != get_batch(record.batch).this_node(os.environ):
        raise UsageError(
            f"run hpcvm cluster exec on {first.node}, the job's first node (its VM runs "
            "mpirun), as a batch script does"
        )
    return record, first


def exec_first(name: str, argv: Sequence[str], workdir: str, timeout: float | None) -> ExecResult:
    """Run ``argv`` in the first node's VM, with the MPI environment that spreads its
    ranks over every VM of the job."""
    from hpcvm.runtime.guest_exec import exec_in

    record, first = first_vm(name)
    machine = vm_of(name, first)
    env = guest_mpi.mpi_environment(IPv4Network(record.network))
    return exec_in(machine, ["/usr/bin/env", "-C", workdir, *argv], timeout, env=env)
