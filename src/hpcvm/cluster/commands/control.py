"""``cluster up``, ``ps``, ``exec --detach``, ``wait`` and ``down``: the orchestration,
on the job's batch node (``cluster exec`` of a command waited for is
commands/first_vm.py's).

``up`` asks the batch system (batch/base.py) for the allocation and starts the holder step
through the holder (commands/holder.py) in its own session, so that it outlives the ``hpcvm``
process that started it and ends only with the step; its output goes to the cluster's
log (job/state.py), where the nodes' event lines arrive and the other commands read them.
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
from ipaddress import IPv4Interface
from pathlib import Path
from typing import TYPE_CHECKING

from hpcvm import timeline
from hpcvm.cluster.batch.base import Allocation, BatchSystem
from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.batch.spawn import internal_argv
from hpcvm.cluster.commands.first_vm import check_first
from hpcvm.cluster.job import checkpoint_model, guest_mpi, state
from hpcvm.cluster.job.spec import (
    SPEC_ENV,
    ClusterRequest,
    ClusterSpec,
    EventKind,
    NodeEvent,
    check_addresses,
    latest_per_node,
    spare_nodes,
)
from hpcvm.cluster.job.state import ClusterRecord
from hpcvm.cluster.job.state_files import LOG_FILE, taken_down_by_another
from hpcvm.cluster.tasks.addresses import AUTO
from hpcvm.errors import HpcvmError, NodeLost, RuntimeFailure, UsageError
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.hostside.shares import check_job_dir
from hpcvm.runtime.machine import state as vm_state
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.migration.channel import new_secret
from hpcvm.runtime.net import netguard
from hpcvm.runtime.net.network import parse_network
from hpcvm.signals import signals_deferred

if TYPE_CHECKING:
    pass

DOWN_WAIT = 60.0  # seconds for every node to report its VM down
LOG_TAIL = 20
POLL = 0.05  # seconds between reads of the holder log for new events


def step_name(cluster: str) -> str:
    """The holder step's name, by which the batch system finds it again."""
    return f"hpcvm-cluster-{cluster}"


Say = Callable[[str], None]


# -- up ---------------------------------------------------------------------------------


def up(
    request: ClusterRequest, timeout: float, say: Say, restore: Path | None = None
) -> list[NodeEvent]:
    """Start the VMs of ``request.name`` on every node of this allocation; return their
    ready events, or raise after taking every VM down again. With ``restore`` (a job
    checkpoint, cluster/job/checkpoint_model.py) each node restores its saved VM instead,
    paused, and every VM runs again only once all are loaded."""
    timeline.mark_process_start("client: process start")
    timeline.mark("client: up entered")
    batch = get_batch(request.batch)
    saved = checkpoint_model.read(restore) if restore is not None else None
    if saved is None:
        check_isolation(request)
        _check_new_guests(request)
    allocation = batch.allocation(request.nodes, os.environ)
    vm_nodes = _vm_nodes(allocation, request.spare)
    if saved is not None and len(saved.vms) != len(vm_nodes):
        raise UsageError(
            f"job checkpoint {restore} holds {len(saved.vms)} VMs and this allocation has "
            f"{len(vm_nodes)} node(s) for VMs: restore it in a job of {len(saved.vms)} "
            "nodes (plus --spare)"
        )
    if request.first_address != AUTO:
        check_addresses(request.first_address, len(vm_nodes))
    name = request.name
    with state.one_writer(name), state.claimed(name) as directory:
        if saved is not None and restore is not None:
            public, private = state.install_keys(directory, restore, saved.key_sha256)
        else:
            public, private = state.make_keys(directory, name)
        timeline.mark("client: keys made")
        spec = ClusterSpec.model_validate(
            {
                **request.model_dump(),
                "job_id": allocation.job_id,
                "nodes": len(allocation.nodes),
                "public_key": public,
                "restore": str(restore) if restore is not None else None,
                "migration_secret": new_secret(),
            }
        )
        state.write_spec(directory, spec)
        holder = _start_holder(batch, allocation, spec, directory)
        timeline.mark("client: holder started")
        record = ClusterRecord(
            name=name,
            batch=batch.name,
            job_id=allocation.job_id,
            nodes=vm_nodes,
            spare=allocation.nodes[len(vm_nodes) :],
            holder_pid=holder.pid,
            network=saved.network if saved is not None else "",
            vcpus=spec.plan.vcpus,
            detached=saved.detached if saved is not None else (),
        )
        state.write_record(record)
        verb = "restoring the VMs of a job checkpoint" if saved else "starting a VM"
        say(f"{name}: {verb} on {len(vm_nodes)} node(s): {', '.join(vm_nodes)}")
        if record.spare:
            say(f"{name}: spare node(s), for cluster migrate: {', '.join(record.spare)}")
        try:
            if saved is not None:
                _wait_for(record, holder, timeout, say, "loaded")
                _resume_all(record, batch)
                return _wait_for(record, holder, timeout, say, "ready")
            ready = _wait_for(record, holder, timeout, say, "ready")
            timeline.mark("client: every node ready")
            state.write_record(_launch_mpi(record, ready, private))
            timeline.mark("client: MPI launcher set")
            return ready
        except BaseException:
            with signals_deferred():
                _take_down(record, holder, say)
            raise


def _vm_nodes(allocation: Allocation, spare: int) -> tuple[str, ...]:
    """The allocation's nodes that start a VM: all but the last ``spare``."""
    if spare >= len(allocation.nodes):
        raise UsageError(
            f"--spare {spare} leaves none of the allocation's {len(allocation.nodes)} "
            "node(s) for a VM: ask the batch system for more nodes, or fewer spares"
        )
    return allocation.nodes[: len(allocation.nodes) - spare]


def check_isolation(request: ClusterRequest, config: Path = netguard.CONFIG) -> None:
    """Where the site isolates jobs on the segment (``job-isolation on``: a VM receives
    from its job's VMs and the nodes only), every node must know the job's addresses
    before its VM runs, which ``--address auto`` (each node picks its own) cannot give:
    refused before anything starts. ``config``: the admin's netguard config."""
    bridged = request.vm.network is not None and parse_network(request.vm.network).kind == "bridge"
    if request.first_address == AUTO and bridged and netguard.isolation_on(config):
        raise UsageError(
            f"cluster up --address auto: this site isolates jobs on the segment "
            f"('job-isolation on' in {config}) and with auto each node picks its VM's "
            "address alone, so no VM would know its job's others: give --address IP/PREFIX "
            "(the job's VMs get it and the next ones)"
        )


def _check_new_guests(request: ClusterRequest) -> None:
    """What new guests need of this node: the built-in guest runs the host's sshd and
    the job's directory is shared with it (a disk image brings its own sshd)."""
    if request.vm.image is not None:
        return
    guest_mpi.require_sshd()
    check_job_dir(request.workdir, request.vm.shares)
    check_workdir(request.workdir, request.vm.backend)


def _resume_all(record: ClusterRecord, batch: BatchSystem) -> None:
    """Every node has loaded its VM, paused: tell every node's task to run it (SIGUSR1
    to the holder step's tasks, cluster/tasks/node.py)."""
    step = _step(record, batch)
    if step is None or not batch.signal_step(step, "USR1"):
        raise RuntimeFailure(
            f"could not tell the nodes of cluster {record.name} to run their restored VMs "
            f"(step {step or 'not found'})"
        )


def _launch_mpi(record: ClusterRecord, ready: list[NodeEvent], private_key: str) -> ClusterRecord:
    """Make the first VM (this node's) the job's MPI launcher once every VM reported
    its address: the hostfile of every VM's address with its vCPUs as slots, and the
    job's private key (job/guest_mpi.py). The record learns the VMs' network."""
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
    from hpcvm.runtime.backends.registry import get_backend
    from hpcvm.runtime.hostside.confine import can_access

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
    with (directory / LOG_FILE).open("ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=spec.workdir,
            start_new_session=True,
        )


def _wait_for(
    record: ClusterRecord,
    holder: subprocess.Popen[bytes],
    timeout: float,
    say: Say,
    kind: EventKind,
) -> list[NodeEvent]:
    """Until every node reported ``kind`` (its events, read as they arrive), one
    failed, the step ended or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    announced: set[int] = set()
    while True:
        events = state.events(record.name)
        latest = latest_per_node(events)
        for index, event in latest.items():
            if event.event == kind and index not in announced:
                announced.add(index)
                said = "loaded, paused" if kind == "loaded" else "ready"
                say(f"{event.node}: {event.vm} {said} at {event.address}")
        bad = [e for e in latest.values() if e.event in ("failed", "died")]
        if bad:
            e = bad[0]
            raise RuntimeFailure(
                f"node {e.node}: {e.message}; every VM of cluster {record.name} is taken down"
                f"{_log_hint(record.name)}"
            )
        arrived = [e for e in latest.values() if e.event == kind]
        if len(arrived) == len(record.nodes) and _spares_listen(record, events):
            return arrived
        if holder.poll() is not None:
            raise RuntimeFailure(
                f"the holder step of cluster {record.name} ended (exit {holder.returncode}) "
                f"before every node was {kind}{_log_hint(record.name)}"
            )
        if time.monotonic() > deadline:
            missing = [n for i, n in enumerate(record.nodes) if i not in announced]
            raise RuntimeFailure(
                f"node(s) {', '.join(missing)} did not report their VM {kind} within "
                f"{timeout:g} s{_log_hint(record.name)}"
            )
        time.sleep(POLL)


def _spares_listen(record: ClusterRecord, events: list[NodeEvent]) -> bool:
    """Every spare node's task listens for a migrating VM."""
    return set(record.spare) <= set(spare_nodes(events))


def _log_hint(name: str) -> str:
    lines = state.log_lines(name)[-LOG_TAIL:]
    if not lines:
        return ""
    sys.stderr.write("hpcvm: the nodes' output:\n" + "\n".join(lines) + "\n")
    return " (the nodes' output is above)"


# -- down -------------------------------------------------------------------------------


def allocation_of(record: ClusterRecord, nodes: tuple[str, ...] | None = None) -> Allocation:
    """The job's allocation, as far as its VMs' nodes go (or only ``nodes``: a step on
    those)."""
    return Allocation(
        batch=record.batch, job_id=record.job_id, nodes=record.nodes if nodes is None else nodes
    )


def _step(record: ClusterRecord, batch: BatchSystem) -> str | None:
    found = next((e.step for e in state.events(record.name) if e.step), None)
    return found or batch.find_step(allocation_of(record), step_name(record.name))


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


def take_down(record: ClusterRecord, say: Say) -> None:
    """End the job's VMs (``down`` without its lock: a caller that holds it, such as
    ``cluster checkpoint``); RuntimeFailure naming nodes that did not confirm."""
    unconfirmed = _take_down(record, None, say)
    if unconfirmed:
        raise RuntimeFailure(
            f"node(s) {', '.join(unconfirmed)} did not confirm their VM down; the batch "
            "system ended the step, check those nodes with hpcvm ps"
        )


def _holder_running(record: ClusterRecord, holder: subprocess.Popen[bytes] | None) -> bool:
    if holder is not None:
        return holder.poll() is None
    return state.holder_alive(record)


def down(name: str, say: Say) -> None:
    """Take every VM of cluster ``name`` down, on every node."""
    with state.one_writer(name):
        try:
            record = state.read_record(name)
        except NodeLost:
            state.forget_ended(name)  # said once, here: the job's end is told
            raise
        with signals_deferred():
            take_down(record, say)


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


class JobWatch:
    """Whether a running job lost a node's VM, for ``cluster wait``: a VM that died or a
    node task that failed (a node that crashed, a VM killed) says so in an event, and
    then the step ends the others and the holder removes the job's state. So each look
    remembers the losses it saw, and a job whose state went without ``cluster down``
    (no ``taking-down`` mark) while its program ran counts as lost too. A guest whose
    peer vanished is not told (its TCP connections wait out their retransmissions), so
    its MPI program would hang: watching the job is how the wait ends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: dict[int, NodeEvent] = {}
        self.downed = False  # a `cluster down` was seen taking it down: not lost
        self.where: dict[int, str] = {}  # VM index -> the node it was last ready on
        self.moves: list[str] = []  # what moved since the caller last took them
        # Settled killed moves already in the log when the watch began: ps shows those.
        self.settled = len(state.settled_moves(name))

    def _note_moves(self, latest: Sequence[NodeEvent]) -> None:
        for event in latest:
            if event.event != "ready":
                continue
            was = self.where.get(event.index)
            if was is not None and was != event.node:
                self.moves.append(
                    f"cluster {self.name}: its VM {event.index} moved from {was} to "
                    f"{event.node} (now {event.vm})"
                )
            self.where[event.index] = event.node
        settled = state.settled_moves(self.name)
        self.moves.extend(settled[self.settled :])
        self.settled = max(self.settled, len(settled))

    def lost(self) -> str | None:
        """One line naming what was lost, or None while every VM runs."""
        directory = state.cluster_dir(self.name)
        try:
            _record, latest, alive = status(self.name)
        except NodeLost:  # the holder removed the state, noting why its step ended
            return state.ended_note(self.name)
        except UsageError:  # no record: the holder removed the job's state
            latest, alive = [], False
        except (HpcvmError, OSError, ValueError):
            return None  # a read that failed now; the next look tells
        self._note_moves(latest)
        for event in latest:
            if event.event in ("died", "failed"):
                self.seen[event.index] = event
        if self.seen:
            return "; ".join(
                f"{e.node}: {e.message or e.event}" for _i, e in sorted(self.seen.items())
            )
        self.downed = self.downed or taken_down_by_another(directory)
        if not alive and not self.downed:
            return "its holder step ended while the program ran (the job's VMs are gone)"
        return None


def first_vm(name: str) -> tuple[ClusterRecord, NodeEvent]:
    """The record and the first node's ``ready`` event, checked to be on this node
    (where mpirun runs: ``exec``, bench's runs)."""
    record, latest, alive = status(name)
    first = next((e for e in latest if e.index == 0), None)
    return record, check_first(name, record.batch, alive, first)


def restore_request(
    directory: Path, name: str, batch: str, nodes: int | None, workdir: str, spare: int = 0
) -> ClusterRequest:
    """What ``cluster up --restore`` asks: the saved job's request (every node plans it
    again for itself), under this job's name, batch system, directory and spares."""
    saved = checkpoint_model.read(directory)
    fields = saved.spec.model_dump(include=set(ClusterRequest.model_fields))
    return ClusterRequest.model_validate(
        {
            **fields,
            "name": name,
            "batch": batch,
            "nodes": nodes,
            "workdir": workdir,
            "spare": spare,
        }
    )
