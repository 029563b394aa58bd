"""One task of the holder step: the VM of one node, from boot to the step's end.

The task plans the VM from its own node's topology (unlike nodes get unlike plans),
boots it on the node's network, starts the guest's sshd (job/guest_mpi.py), reports
``ready`` and then holds the VM: when the batch system ends the step (``cluster down``,
the job's end, ``scancel``) it stops the VM and removes what hpcvm made on this node;
when the VM dies it reports ``died`` and exits non-zero, and the step ends the other
nodes' tasks (Slurm's ``--kill-on-bad-exit``), so no job keeps running on part of its
VMs.

A batch system sends SIGTERM and, a while later (Slurm's ``KillWait``), SIGKILL:
stopping is forceful (QEMU is told to quit over QMP, the guest is not asked to shut
down), so it fits in that window; if the task is killed anyway, its reaper (tasks/reaper.py)
finishes the job.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import replace
from ipaddress import IPv4Interface
from pathlib import Path
from types import FrameType
from typing import Literal

from hpcvm import timeline
from hpcvm.cluster.batch.base import TaskPlace
from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.job import guest_mpi
from hpcvm.cluster.job.spec import SPEC_ENV, ClusterSpec, EventKind, NodeEvent
from hpcvm.cluster.tasks import reaper
from hpcvm.cluster.tasks.addresses import AUTO, Claim, candidates, claim, site_pool
from hpcvm.cluster.tasks.moved import migrated_away
from hpcvm.errors import HpcvmError, InfeasiblePlanError, RuntimeFailure, UsageError
from hpcvm.plan.model import PlanRequest
from hpcvm.runtime.backends.registry import get_backend
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.machine.options import UpOptions
from hpcvm.runtime.net import netguard
from hpcvm.runtime.net.network import ADDRESS_IN_USE, node_address
from hpcvm.runtime.net.vm_nics import DISK_ADDRESS_WARNING
from hpcvm.runtime.vm import lifecycle, stopping
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
    """An event of this node; ``vm`` defaults to the name a new VM gets here (a
    restored one keeps its saved name)."""
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
    log. Not the one that a disk image's address is not set: the node sets it
    (guest_mpi.address_script)."""
    if text != DISK_ADDRESS_WARNING:
        _stderr(f"warning: {text}")


def _stderr(text: str) -> None:
    """A line on stderr, which the step relays to the holder log."""
    sys.stderr.write(f"hpcvm: {text}\n")
    sys.stderr.flush()


def _boot(spec: ClusterSpec, place: TaskPlace) -> tuple[Machine, Claim | None]:
    """Plan and boot this node's VM at its address, then start its sshd; with
    ``--address auto`` the first of the node's slots that no VM claims and nobody on the
    segment answers for (tasks/addresses.py), and the claim held for the VM's life."""
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


def job_addresses(spec: ClusterSpec) -> list[str]:
    """The addresses of the job's VMs where every node knows them before any VM runs: a
    job checkpoint's saved ones, or ``--address IP/PREFIX``'s (the k-th node's VM the
    k-th next); none with ``--address auto`` (each node picks its own: cluster up
    refuses it where job isolation is on). A tap's netguard peers (runtime/net/netguard.py):
    with job isolation on, these VMs and the nodes are all a VM receives from."""
    if spec.restore:
        from hpcvm.cluster.job.checkpoint_model import read

        return [vm.address for vm in read(Path(spec.restore)).vms]
    if spec.first_address == AUTO:
        return []
    return [str(spec.address(index).ip) for index in range(spec.vm_count)]


def _boot_at(spec: ClusterSpec, name: str, address: IPv4Interface) -> Machine:
    options = UpOptions(
        **spec.vm.model_dump(exclude={"address"}),
        name=name,
        workdir=spec.workdir,
        address=str(address),
    )
    with netguard.job_peers(job_addresses(spec)):
        machine = _up(spec, spec.plan.model_copy(update={"name": name}), options)
    timeline.mark("node: VM up")
    try:
        _start_sshd(spec, machine, address)
        timeline.mark("node: guest sshd started")
    except BaseException:
        stopping.teardown(machine)
        raise
    return machine


def _start_sshd(spec: ClusterSpec, machine: Machine, address: IPv4Interface) -> None:
    """The guest's sshd with the job's keys; a disk-image guest gives itself its address
    first (job/guest_mpi.py), in the same agent call."""
    script = guest_mpi.sshd_script(machine.name, address)
    if machine.boot.disk_image is not None and machine.boot.nics:
        script = guest_mpi.address_script(machine.boot.nics[0].mac, address) + script
    keys = guest_mpi.sshd_stdin(spec.public_key, guest_mpi.host_key(machine.name))
    causes = {guest_mpi.ADDRESS_TAKEN_EXIT: ADDRESS_IN_USE}
    guest_mpi.run_script(machine, script, keys, "starting sshd", causes=causes)


def _restore(spec: ClusterSpec, place: TaskPlace) -> tuple[Machine, Claim | None]:
    """Restore this node's VM of the job checkpoint, re-planned for this node, under
    its saved name (its MAC follows the name) at its saved address, which must be free
    here: claimed on this node (tasks/addresses.py) and not answered for on the segment.
    Once its state is loaded, the VM waits, paused, until every node's is (the client
    sends SIGUSR1, commands/control.py), so that no guest runs while another is still frozen."""
    from hpcvm.cluster.job.checkpoint_model import read, vm_dir_name
    from hpcvm.cluster.tasks.address_probe import check_free
    from hpcvm.runtime.checkpoint import save_restore as checkpoint

    directory = Path(spec.restore or "")
    saved = read(directory).vms[place.index]
    address = IPv4Interface(saved.address)
    held = claim(address)
    if held is None:
        raise RuntimeFailure(
            f"address {address.ip} of the saved VM {saved.vm} is claimed by another VM on "
            f"node {place.node}: restore the job on other nodes, or stop that VM"
        )
    go = threading.Event()
    signal.signal(signal.SIGUSR1, lambda _s, _f: go.set())

    def wait_for_every_node(machine: Machine) -> None:
        emit(_event("loaded", spec, place, vm=machine.name, address=saved.address))
        while not go.wait(0.05):
            pass

    try:
        check_free(address, saved.vm)
        with netguard.job_peers(job_addresses(spec)):
            restored = checkpoint.restore(
                directory / vm_dir_name(place.index),
                name=saved.vm,
                warn=_warn,
                before_resume=wait_for_every_node,
            )
    except BaseException:
        held.release()
        raise
    if restored.clock is not None:
        _stderr(
            f"{saved.vm}: guest clock was {restored.clock.behind_before:.1f} s behind the "
            "host's; stepped to it"
        )
    return restored.machine, held


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


def _stop_on_signals() -> threading.Event:
    """An event the batch system's SIGTERM (or SIGINT, SIGHUP) sets: the step ends."""
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for s in _SIGNALS:
        signal.signal(s, _stop)
    return stop


Outcome = Literal["ended", "died", "migrated"]


def _hold(machine: Machine, stop: threading.Event) -> Outcome:
    """Wait until the step is ended, the VM dies, or it migrated away (its QEMU is
    then stopped here, tasks/migrate_node.py)."""
    backend = get_backend(machine.backend, machine.connect_uri)
    while not stop.wait(0.5):
        if migrated_away(machine):
            return "migrated"
        if not backend.alive(machine):
            return "migrated" if migrated_away(machine) else "died"
    return "ended"


def _vm_name(spec: ClusterSpec, place: TaskPlace) -> str:
    """This node's VM's name: a new one's from the node, a restored one's as saved.
    A restored name already in use here is refused before the reaper starts: the
    reaper would take that other VM down when this task ends."""
    if not spec.restore:
        return spec.vm_name(place.node)
    from hpcvm.cluster.job.checkpoint_model import read
    from hpcvm.runtime.hostside import paths

    vm = read(Path(spec.restore)).vms[place.index].vm
    if paths.run_dir(vm).exists():
        raise UsageError(
            f"a VM named {vm} already exists on node {place.node}: does the job this "
            "checkpoint was saved from still run? take it down first, or restore elsewhere"
        )
    return vm


def run() -> int:
    """The task's whole life; its exit code tells the step whether this node failed."""
    timeline.mark_process_start("node: process start")
    timeline.mark("node: task entered")
    # SIGUSR1 is the go of a restore (below); anyone else's (a batch script's
    # --signal=USR1 without B:) must not end the VMs
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    spec = read_spec()
    os.environ.pop(SPEC_ENV, None)  # its migration secret is not for QEMU or the reaper
    place = get_batch(spec.batch).task_place(os.environ)
    spare = place.index >= spec.vm_count
    try:
        vm = _incoming_name(spec, place.node) if spare else _vm_name(spec, place)
    except HpcvmError as exc:
        emit(_event("failed", spec, place, message=str(exc)))
        return 1
    reaper.start(vm)  # its pipe closes when this process ends
    timeline.mark("node: reaper started")
    if spare:
        return _spare(spec, place, _stop_on_signals(), {vm}, vm)
    try:
        with interrupting(*_SIGNALS):  # up then removes a half-started VM itself
            machine, held = _restore(spec, place) if spec.restore else _boot(spec, place)
    except (HpcvmError, KeyboardInterrupt) as exc:
        why = "interrupted while starting" if isinstance(exc, KeyboardInterrupt) else str(exc)
        emit(_event("failed", spec, place, vm=vm, message=why))
        return 1
    timeline.mark("node: ready")
    return _serve(spec, place, _stop_on_signals(), {vm}, machine, held)


def _serve(
    spec: ClusterSpec,
    place: TaskPlace,
    stop: threading.Event,
    reaped: set[str],
    machine: Machine,
    held: Claim | None,
    moved_in: str | None = None,
) -> int:
    """Hold the VM until the step ends (0), it dies (1), or it migrates away: then
    this node becomes a spare (``_spare``). A VM that moved in claims its address
    (``moved_in``) once it is reported ready: a move whose source step died releases
    it at the old node only after ``cluster migrate`` saw that ready."""
    emit(_ready(spec, place, machine))
    if moved_in is not None:
        from hpcvm.cluster.tasks import migrate_node

        held = migrate_node.claim_moved(moved_in, _stderr)
    outcome = _hold(machine, stop)
    with signals_deferred():  # a second SIGTERM must not cut the teardown short
        stopping.teardown(machine)
        if held is not None:
            held.release()
    vm = machine.name
    if outcome == "ended":
        emit(_event("down", spec, place, vm=vm))
        return 0
    if outcome == "died":
        emit(_event("died", spec, place, vm=vm, message=f"VM {vm} died; see its console log"))
        return 1
    emit(_event("migrated", spec, place, vm=vm))
    incoming = _incoming_name(spec, place.node)
    if incoming not in reaped:
        reaper.start(incoming)
        reaped.add(incoming)
    return _spare(spec, place, stop, reaped, incoming)


def _ready(spec: ClusterSpec, place: TaskPlace, machine: Machine) -> NodeEvent:
    return _event(
        "ready",
        spec,
        place,
        vm=machine.name,
        address=machine.boot.nics[0].address if machine.boot.nics else None,
        vcpu_pus=tuple(p.host_pu for p in machine.plan.placements),
        profile=machine.plan.profile,
        accel=machine.plan.accel,
        log=machine.boot.serial_log or "",
    )


def _incoming_name(spec: ClusterSpec, node: str) -> str:
    """The name a VM migrating in gets here: the node's VM name, unless a VM of that
    name exists already (a restored VM keeps its saved name, and where nodes share a
    runtime directory, as the one-machine test cluster's do, it may be this node's)."""
    from hpcvm.runtime.hostside import paths

    name = spec.vm_name(node)
    for k in range(1, 100):
        if not paths.run_dir(name).exists():
            return name
        name = f"{spec.vm_name(node)}-m{k}"
    raise RuntimeFailure(f"no free name for a VM migrating into {node}")


def _spare(
    spec: ClusterSpec, place: TaskPlace, stop: threading.Event, reaped: set[str], name: str
) -> int:
    """A node without a VM: listen for one to migrate in (tasks/migrate_node.py) until the
    step ends (0); a VM taken in is then held as this node's (``name``, whose reaper
    runs), under the index it had."""
    from hpcvm.cluster.tasks import migrate_node

    try:
        host = str(node_address(spec.vm.network or "").ip)
        listener = migrate_node.Listener(host)
    except (HpcvmError, OSError) as exc:
        why = f"this spare node cannot listen for a migrating VM: {exc}"
        emit(_event("failed", spec, place, vm="", message=why))
        return 1

    def listening(move: str = "") -> None:
        emit(_event("spare", spec, place, vm="", address=listener.address, move=move))

    try:
        listening()
        with netguard.job_peers(job_addresses(spec)):
            got = migrate_node.take_in(
                listener, spec.migration_secret, name, stop, _stderr, relisten=listening
            )
    finally:
        listener.close()
    if got is None:
        return 0
    machine, index, address = got
    return _serve(spec, replace(place, index=index), stop, reaped, machine, None, address)
