"""What every node of a cluster job is asked to do, and what it answers.

``cluster up`` fixes one :class:`ClusterSpec` for the whole job and hands it to the
holder step's tasks in their environment (a batch system exports the caller's
environment to every task), so no shared file system is needed to start the VMs. Each
task answers with :class:`NodeEvent` lines on its standard output, which the step
relays to the batch node, where ``cluster up``, ``ps``, ``exec`` and ``down`` read them.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

from pydantic import Field, ValidationError

from hpcvm.cluster.job.view import EVENT_PREFIX as EVENT_PREFIX  # re-exported
from hpcvm.cluster.job.view import EventKind as EventKind
from hpcvm.cluster.job.view import latest_per_node as latest_per_node
from hpcvm.errors import UsageError
from hpcvm.model import Frozen
from hpcvm.runtime.machine.options import VmRequest
from hpcvm.runtime.net.network import parse_address

SPEC_ENV = "HPCVM_CLUSTER_SPEC"
DEFAULT_BATCH = "slurm"


class ClusterRequest(VmRequest):
    """What ``cluster up`` asks for: the VM every node plans for itself and boots the
    same way (``VmRequest``, whose ``vm.network`` is each node's), the batch system, and
    how the VMs are joined and addressed."""

    name: str
    batch: str = DEFAULT_BATCH  # a name in cluster/batch/registry.py BATCH_SYSTEMS
    nodes: int | None = None  # --nodes: how many (the batch system may decide)
    # The first node's VM's IPv4 interface (10.0.0.101/24; the k-th node's VM gets the
    # k-th next one), or "auto": each node's VM an address of the site's pool derived
    # from the node's own (cluster/tasks/addresses.py)
    first_address: str
    workdir: str  # shared with every guest at the same path (the job's directory)
    # A node too small for the hpc profile's housekeeping core plans with none and warns
    # (bench --nodes, as one-node bench does); cluster up refuses instead.
    housekeeping_fallback: bool = False
    # The allocation's last ``spare`` nodes run no VM: they wait for one to migrate in
    # (cluster migrate)
    spare: int = Field(default=0, ge=0)


class ClusterSpec(ClusterRequest):
    """One cluster job as every node gets it: the request, the job it runs in and its
    SSH key pair."""

    job_id: str
    nodes: int  # how many nodes the job has (one VM on each)
    public_key: str  # the job's SSH key: every guest's sshd accepts it (its private
    #                  half stays on the batch node: cluster up installs it in the
    #                  first VM only, where mpirun runs)
    # A job checkpoint (cluster/job/checkpoint_model.py) each node restores its VM from,
    # instead of booting one: ``cluster up --restore DIR``
    restore: str | None = None
    # What a migration's two nodes prove to each other (runtime/migration/channel.py);
    # made per job by cluster up (its state is private), left out of job checkpoints
    migration_secret: str = ""

    @property
    def vm_count(self) -> int:
        """How many of the job's nodes start a VM (the first ones; the rest are spare)."""
        return self.nodes - self.spare

    def address(self, index: int) -> ipaddress.IPv4Interface:
        """The guest address of the job's ``index``-th node: the first address plus
        ``index``, in the first address's network. Deterministic: no DHCP server."""
        return node_address(self.first_address, index)

    def vm_name(self, node: str) -> str:
        """The VM's name on ``node``: unique in the job and across nodes that share a
        runtime directory (as the one-machine test cluster's nodes do)."""
        return f"{self.name}-{node}"


def node_address(first: str, index: int) -> ipaddress.IPv4Interface:
    """``first`` (an IPv4 interface) moved up by ``index`` host addresses; UsageError
    when that leaves the network or reaches its broadcast address."""
    base = parse_address(first)
    address = base.ip + index
    net = base.network
    if address not in net or address == net.broadcast_address:
        raise UsageError(
            f"--address {first}: node {index + 1} of the job would get {address}, outside "
            f"{net} or its broadcast address; start lower or use a larger network"
        )
    return ipaddress.IPv4Interface(f"{address}/{net.prefixlen}")


def check_addresses(first: str, count: int) -> None:
    """Refuse before anything starts when ``count`` nodes do not fit after ``first``."""
    node_address(first, count - 1)


class NodeEvent(Frozen):
    """What one node's task reports: its VM is ready, failed to start, died, or is
    down; a restoring node first reports its VM ``loaded`` (paused, waiting for every
    other node's). ``vcpu_pus`` maps vCPU -> host PU (None: not pinned)."""

    event: EventKind
    node: str
    index: int
    vm: str
    step: str | None = None  # JOBID.STEPID of the holder step
    address: str | None = None
    vcpu_pus: tuple[int | None, ...] = ()
    profile: str | None = None
    accel: str | None = None
    message: str = ""
    log: str = ""  # a log that says more (the VM's console or QEMU log on that node)
    move: str = ""  # a spare's again after a failed move: that move's id (commands/migrate.py)

    def line(self) -> str:
        """The event as one line of the task's standard output."""
        return EVENT_PREFIX + self.model_dump_json()


def parse_events(lines: Iterable[str]) -> list[NodeEvent]:
    """The events among ``lines`` (srun may prefix a task label; other output is the
    tasks' own and ignored here). A garbled event line is skipped, not fatal: the log
    keeps it for a person to read."""
    events = []
    for line in lines:
        _, found, payload = line.partition(EVENT_PREFIX)
        if not found:
            continue
        try:
            events.append(NodeEvent.model_validate(json.loads(payload)))
        except (ValueError, ValidationError):
            continue
    return events


def spare_nodes(events: Iterable[NodeEvent]) -> dict[str, NodeEvent]:
    """The nodes whose task listens for a migrating VM now, with its ``spare`` event
    (``address``: where it listens), by node name."""
    last: dict[str, NodeEvent] = {}
    for event in events:
        last[event.node] = event
    return {node: e for node, e in last.items() if e.event == "spare"}
