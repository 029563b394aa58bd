"""One task of the holder step: the VM of one node, from boot to the step's end.

The task plans the VM from its own node's topology (unlike nodes get unlike plans),
boots it on the node's network, starts the guest's sshd (guest_mpi.py), reports
``ready`` and then holds the VM: when the batch system ends the step (``cluster down``,
the job's end, ``scancel``) it stops the VM and removes what hpcvm made on this node;
when the VM dies it reports ``died`` and exits non-zero, and the step ends the other
nodes' tasks (Slurm's ``--kill-on-bad-exit``), so no job keeps running on part of its
VMs.

A batch system sends SIGTERM and, a while later (Slurm's ``KillWait``), SIGKILL:
stopping is forceful (QEMU is told to quit over QMP, the guest is not asked to shut
down), so it fits in that window; if the task is killed anyway, its reaper (reaper.py)
finishes the job.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from ipaddress import IPv4Interface
from types import FrameType

from hpcvm import timeline
from hpcvm.cluster import guest_mpi, reaper
from hpcvm.cluster.addresses import AUTO, Claim, candidates, claim, site_pool
from hpcvm.cluster.batch import TaskPlace
from hpcvm.cluster.batches import get_batch
from hpcvm.cluster.spec import SPEC_ENV, ClusterSpec, EventKind, NodeEvent
from hpcvm.errors import HpcvmError, InfeasiblePlanError, RuntimeFailure, UsageError
from hpcvm.plan.model import PlanRequest
from hpcvm.runtime import lifecycle, stopping
from hpcvm.runtime.backends import get_backend
from hpcvm.runtime.model import Machine
from hpcvm.runtime.network import ADDRESS_IN_USE, node_address
from hpcvm.runtime.options import UpOptions
from hpcvm.signals import interrupting, signals_deferred

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def read_spec(env: dict[str, str] | None = None) -> ClusterSpec:
    """The job's spec, as ``cluster up`` put it in the environment."""
    text = (os.environ if env is None else env).get(SPEC_ENV)
    if not text:
        raise UsageError(
            "a node's task is started by hpcvm cluster up (through the batch system), not by hand"
        )
    return ClusterSpec.model_validate_json(text)


def emit(event: NodeEvent) -> None:
    """One event line on stdout, which the step relays to the batch node at once."""
    sys.stdout.write(event.line() + "\n")
    sys.stdout.flush()


def _event(kind: EventKind, spec: ClusterSpec, place: TaskPlace, **fields: object) -> NodeEvent:
    return NodeEvent.model_validate(
        {
            "event": kind,
            "node": place.node,
            "index": place.index,
            "vm": spec.vm_name(place.node),
            "step": place.step,
            **fields,
        }
    )


def _warn(text: str) -> None:
    """A warning of this node's ``up``: on stderr, which the step relays to the holder
    log."""
    sys.stderr.write(f"hpcvm: warning: {text}\n")
    sys.stderr.flush()


def _boot(spec: ClusterSpec, place: TaskPlace) -> tuple[Machine, Claim | None]:
    """Plan and boot this node's VM at its address, then start its sshd; with
    ``--address auto`` the first of the node's slots that no VM claims and nobody on the
    segment answers for (addresses.py), and the claim held for the VM's life."""
    name = spec.vm_name(place.node)
    if spec.first_address != AUTO:
        return _boot_at(spec, name, spec.address(place.index)), None
    pool = site_pool()
    own = node_address(spec.vm.network or "")
    tried = []
    for address in candidates(pool, own):
        got = claim(address)
        if got is None:
            tried.append(f"{address.ip} (claimed)")
            continue
        try:
            return _boot_at(spec, name, address), got
        except RuntimeFailure as exc:
            got.release()
            if exc.cause != ADDRESS_IN_USE:
                raise
            tried.append(f"{address.ip} (in use on the segment)")
        except BaseException:
            got.release()
            raise
    raise RuntimeFailure(
        f"no free VM address for node {place.node} ({own.ip}) in {pool.network}: "
        f"{'; '.join(tried)}; stop a VM here or ask the admin for more slots"
    )


def _boot_at(spec: ClusterSpec, name: str, address: IPv4Interface) -> Machine:
    options = UpOptions(
        **spec.vm.model_dump(exclude={"address"}),
        name=name,
        workdir=spec.workdir,
        address=str(address),
    )
    machine = _up(spec, spec.plan.model_copy(update={"name": name}), options)
    timeline.mark("node: VM up")
    try:
        keys = guest_mpi.sshd_stdin(spec.public_key, guest_mpi.host_key(name))
        guest_mpi.run_script(machine, guest_mpi.sshd_script(name, address), keys, "starting sshd")
        timeline.mark("node: guest sshd started")
    except BaseException:
        stopping.teardown(machine)
        raise
    return machine


def _up(spec: ClusterSpec, request: PlanRequest, options: UpOptions) -> Machine:
    """``lifecycle.up``; where the job allows it (``bench --nodes``), a node too small
    for the hpc profile's housekeeping core plus the vCPUs plans with none, as one-node
    ``bench`` does, and says so in its warnings."""
    try:
        return lifecycle.up(request, options, warn=_warn)
    except InfeasiblePlanError as exc:
        fallback = spec.housekeeping_fallback and request.housekeeping is None
        if not fallback or exc.cause != "housekeeping":
            raise
    _warn(
        f"{request.profile}: this node has too few PUs for {request.vcpus} vCPUs plus a "
        "housekeeping core; planned with housekeeping 0 (QEMU's own threads share the "
        "vCPUs' cores)"
    )
    return lifecycle.up(request.model_copy(update={"housekeeping": 0}), options, warn=_warn)


def _hold(machine: Machine) -> bool:
    """Wait until the step is ended (True) or the VM dies (False)."""
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for s in _SIGNALS:
        signal.signal(s, _stop)
    backend = get_backend(machine.backend, machine.connect_uri)
    while not stop.wait(0.5):
        if not backend.alive(machine):
            return False
    return True


def run() -> int:
    """The task's whole life; its exit code tells the step whether this node failed."""
    timeline.mark_process_start("node: process start")
    timeline.mark("node: task entered")
    spec = read_spec()
    place = get_batch(spec.batch).task_place(os.environ)
    reaper.start(spec.vm_name(place.node))  # its pipe closes when this process ends
    timeline.mark("node: reaper started")
    try:
        with interrupting(*_SIGNALS):  # up then removes a half-started VM itself
            machine, held = _boot(spec, place)
    except (HpcvmError, KeyboardInterrupt) as exc:
        why = "interrupted while starting" if isinstance(exc, KeyboardInterrupt) else str(exc)
        emit(_event("failed", spec, place, message=why))
        return 1
    timeline.mark("node: ready")
    emit(
        _event(
            "ready",
            spec,
            place,
            address=machine.boot.nics[0].address if machine.boot.nics else None,
            vcpu_pus=tuple(p.host_pu for p in machine.plan.placements),
            profile=machine.plan.profile,
            accel=machine.plan.accel,
            log=machine.boot.serial_log or "",
        )
    )
    ended = _hold(machine)
    with signals_deferred():  # a second SIGTERM must not cut the teardown short
        stopping.teardown(machine)
        if held is not None:
            held.release()
    if ended:
        emit(_event("down", spec, place))
        return 0
    emit(_event("died", spec, place, message=f"VM {machine.name} died; see its console log"))
    return 1
