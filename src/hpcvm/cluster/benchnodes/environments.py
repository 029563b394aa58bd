"""``hpcvm bench --nodes N``: native and VM environments that span an allocation's nodes.

Fair by construction: both run the same suite argv, whose ``mpirun`` line
(bench/core/launch.py ``across``) spreads ranks round-robin over the nodes on the same
network with the same transports. Natively ``mpirun`` runs on the batch node and finds
the allocation through the batch system's environment (``native_mpi_env``, kept through
the runs' clean environment); in a VM environment it runs in the first node's VM with
the cluster's hostfile and ssh launcher (cluster/job/guest_mpi.py). Native ranks run on
each node where that node's own placement puts them (the PUs its tuned VM has its vCPUs
pinned to, cluster/benchnodes/native_places.py, which says what Open MPI 4.1 allows and what is
recorded when a node differs), as one-node native runs are confined by a cpuset.

What differs from one-node runs, and is recorded with the run: the VMs on the other
nodes are not paused while another environment is measured (pausing them would take a
step per node and sample); the interrupt counts are the batch node's and its VM's.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpcvm.bench.core.launch import mpirun_program, with_cpu_set
from hpcvm.bench.envs.environments import VM_PREFIX, Environment, RunOutput
from hpcvm.bench.envs.guest_sampler import GuestSampler
from hpcvm.bench.envs.kinds import (
    CONTAINER,
    NATIVE,
    VM,
    AcrossNodes,
    EnvRequest,
    register_across_nodes,
)
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.envs.variants import BASE, VmVariant
from hpcvm.bench.envs.vm import describe_vm, verify_variant, with_variant
from hpcvm.bench.run.config import BenchConfig
from hpcvm.cluster.batch.base import Allocation
from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.benchnodes import native_places
from hpcvm.cluster.benchnodes.containers import ClusterContainerEnvironment
from hpcvm.cluster.commands import control
from hpcvm.cluster.job import guest_mpi
from hpcvm.cluster.job.spec import ClusterRequest, check_addresses
from hpcvm.cluster.job.spec import node_address as nth_address
from hpcvm.cluster.tasks.addresses import AUTO, site_pool
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import VMPlan
from hpcvm.runtime.machine.options import VmOptions
from hpcvm.runtime.net.network import node_address, parse_address, with_nic_model
from hpcvm.store.records import EnvKind, NewEnvironment

ENV = "/usr/bin/env"
UP_TIMEOUT = 600.0


class ClusterNativeEnvironment(NativeEnvironment):
    """The job's nodes as they are: mpirun on the batch node, ranks on every node,
    each node's where that node's placement says (cluster/benchnodes/native_places.py)."""

    def __init__(
        self,
        host: HostTopology | None,
        *,
        config: BenchConfig,
        allocation: Allocation,
        cpus: Sequence[int] | None,
        say: Callable[[str], None] = lambda _text: None,
    ) -> None:
        # No cpuset here: it would hold only this node's launcher, and Open MPI 4.1's
        # mpirun exits 1 without a word when its cpu list meets a cpuset on the batch
        # node. The ranks are placed on every node instead (native_places).
        super().__init__(host, cpus=None)
        self.config = config
        self.allocation = allocation
        self.nodes = len(allocation.nodes)
        self.say = say
        per_node = len(cpus) if cpus is not None else self.vcpus
        self.vcpus = per_node * self.nodes  # the PUs ranks may use, over all nodes
        self.places: dict[str, native_places.NodeNative] = {}
        self.common: tuple[int, ...] | None = None

    def start(self) -> None:
        if self.places:
            return
        self.places = native_places.each_node(self.allocation, self.config)
        self.common = native_places.common_cpus(self.places)
        self.vcpus = sum(len(native_places.used(p, self.common)) for p in self.places.values())
        self.say(f"native: {native_places.describe(self.places)}")
        for text in native_places.differences(self.places):
            self.say(f"warning: {text}")

    def describe(self) -> NewEnvironment:
        described = super().describe()
        versions = {
            **described.versions,
            "nodes": str(self.nodes),
            "native_pus": native_places.describe(self.places),
        }
        differ = native_places.differences(self.places)
        if differ:
            versions["native_differs"] = "; ".join(differ)
        return described.model_copy(update={"versions": versions, "vcpus": self.vcpus})

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        placed = with_cpu_set(argv, mpirun_program(), self.common)
        batch_env = get_batch(self.allocation.batch).native_mpi_env(os.environ)
        spread = [ENV, *batch_env, *placed]
        return super().run(spread, workdir, timeout, outputs=outputs)


class ClusterVmEnvironment:
    """One VM per node of the job (``cluster up``); runs start in the first one, through
    a ``GuestSampler`` of its guest (bench/envs/guest_sampler.py), with the MPI environment
    that spreads their ranks over every VM."""

    kind: EnvKind = "vm"
    pauses = False  # the other nodes' VMs cannot be paused from here (module doc)

    def __init__(
        self,
        plan: VMPlan,
        *,
        cluster: str,
        network: str,
        first_address: str,
        allocation: Allocation,
        backend: str = "qemu",
        shares: tuple[str, ...] = (),
        say: Callable[[str], None] = lambda _text: None,
        name: str | None = None,
        variant: VmVariant = BASE,
    ) -> None:
        """``plan``: this (the first) node's plan, which its VM will have; each other
        node plans its own. ``network``: the VMs' NIC, of the variant's model;
        ``variant`` is checked in the first VM after boot (bench/envs/vm.py)."""
        self.plan = plan
        self.name = name or f"{VM_PREFIX}{plan.profile}"
        self.variant = variant
        self.observed: dict[str, str] = {}
        self.nodes = len(allocation.nodes)
        self.vcpus = plan.vcpus * self.nodes  # over all nodes
        self.memory_bytes = plan.memory_bytes
        self.allocation = allocation
        self.cluster = cluster
        self.network = network
        self.first_address = first_address
        self.backend = backend
        self.shares = shares
        self.say = say
        self.sampler: GuestSampler | None = None
        self._pins: list[str] = []
        self._network = ipaddress.IPv4Network("0.0.0.0/32")  # the VMs' (after start)

    def start(self) -> None:
        request = ClusterRequest(
            plan=self.plan.request,
            vm=VmOptions(backend=self.backend, shares=self.shares, network=self.network),
            name=self.cluster,
            batch=self.allocation.batch,
            nodes=self.nodes,
            first_address=self.first_address,
            workdir=os.getcwd(),
            housekeeping_fallback=True,
        )
        ready = control.up(request, UP_TIMEOUT, self.say)
        self._pins = [
            f"{e.node}: " + " ".join(f"{v}->{pu}" for v, pu in enumerate(e.vcpu_pus)) for e in ready
        ]
        record, first = control.first_vm(self.cluster)
        self._network = ipaddress.IPv4Network(record.network)
        machine = control.vm_of(self.cluster, first)
        self.plan = machine.plan
        self.vcpus = self.plan.vcpus * self.nodes
        self.sampler = GuestSampler(machine, self.name)
        self.sampler.learn()
        self.observed = verify_variant(self.name, self.sampler, self.variant)

    def activate(self) -> None:
        return None  # the other nodes' VMs cannot be paused from here (module doc)

    def deactivate(self) -> None:
        return None

    def close(self) -> None:
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.close()
        control.down_if_up(self.cluster, self.say)

    def describe(self) -> NewEnvironment:
        machine = self.sampler.machine if self.sampler is not None else None
        facts = self.sampler.facts if self.sampler is not None else ()
        described = describe_vm(self.name, self.plan, machine, facts, vcpus=self.vcpus)
        versions = {
            **described.versions,
            "nodes": str(self.nodes),
            "vcpu_pins": "; ".join(self._pins),
            "nic": self.network,
        }
        described = described.model_copy(update={"versions": versions})
        return with_variant(described, self.variant, self.observed)

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        if self.sampler is None:
            raise RuntimeFailure(f"{self.name}: the cluster is not up")
        spread = [ENV, *guest_mpi.mpi_environment(self._network), *argv]
        return self.sampler.run(spread, workdir, timeout, outputs=outputs)


def runs_network(address: str, network: str) -> ipaddress.IPv4Network:
    """The network every MPI run of ``bench --nodes`` uses, native and in VMs alike:
    the VMs' (``--address IP/PREFIX``), or with ``--address auto`` the nodes' own
    subnet, which must hold the site's pool so that both kinds of ranks share it."""
    if address != AUTO:
        return parse_address(address).network
    subnet = node_address(network).network  # this (the batch) node's address's
    pool = site_pool().network
    if not pool.subnet_of(subnet):
        raise UsageError(
            f"bench --nodes --address auto: the site's VM pool {pool} lies outside the "
            f"nodes' subnet {subnet}, so native and VM ranks would use different networks: "
            "give --address IP/PREFIX in the nodes' subnet"
        )
    return subnet


class ClusterEnvironments:
    """The environments of ``bench --nodes``: each VM profile is a cluster of its own
    (one VM per node), with addresses after the previous cluster's, so that clusters up
    at the same time never share one."""

    def __init__(
        self,
        *,
        config: BenchConfig,
        allocation: Allocation,
        network: str,
        first_address: str,
        say: Callable[[str], None] = lambda _text: None,
    ) -> None:
        self.config = config
        self.allocation = allocation
        self.nodes = len(allocation.nodes)
        self.network = network
        self.first_address = first_address
        self.say = say
        self._clusters = 0

    def next_first_address(self) -> str:
        """The first address of the next VM cluster: after the previous cluster's."""
        first = self.first_address
        if first != AUTO:
            first = str(nth_address(first, self._clusters * self.nodes))
            check_addresses(first, self.nodes)
        self._clusters += 1
        return first


def _native(request: EnvRequest, nodes: ClusterEnvironments) -> ClusterNativeEnvironment:
    # each node finds its own mems (native_places); its ranks are held by the job's
    # cgroup and mpirun's --cpu-list, whichever way the batch node may confine
    return ClusterNativeEnvironment(
        request.host,
        config=nodes.config,
        allocation=nodes.allocation,
        cpus=request.cpus,
        say=nodes.say,
    )


def _container(request: EnvRequest, nodes: ClusterEnvironments) -> ClusterContainerEnvironment:
    # each node finds its own PUs and mems (native_places), as native does
    return ClusterContainerEnvironment(
        request.host,
        config=nodes.config,
        allocation=nodes.allocation,
        shares=request.shares,
        out_dir=request.out_dir,
        runtime=request.container_runtime,
        say=nodes.say,
    )


def _vm(request: EnvRequest, nodes: ClusterEnvironments) -> ClusterVmEnvironment:
    return ClusterVmEnvironment(
        request.vm_plan,
        cluster=request.vm_name,
        network=with_nic_model(nodes.network, request.choice.variant.nic),
        first_address=nodes.next_first_address(),
        allocation=nodes.allocation,
        backend=request.backend,
        shares=request.shares,
        say=nodes.say,
        name=request.name,
        variant=request.choice.variant,
    )


def _across(factory: Callable[[EnvRequest, ClusterEnvironments], Environment]) -> AcrossNodes:
    """A factory of this module as the kinds' registry holds it: the nodes it is given
    are always a ClusterEnvironments (session.prepare passes what bench_cmd made)."""

    def across(request: EnvRequest, nodes: Any) -> Environment:
        if not isinstance(nodes, ClusterEnvironments):
            raise TypeError(f"{request.name}: nodes of bench --nodes expected, not {nodes!r}")
        return factory(request, nodes)

    return across


register_across_nodes(NATIVE, _across(_native))
register_across_nodes(CONTAINER, _across(_container))
register_across_nodes(VM, _across(_vm))
