"""What every VMPlan must satisfy, checked against the host it was made for.

The expectations here are computed from the HostTopology directly (which PUs are usable,
which cores each node has, what the host's distances are), never from the planner's own
helpers, so a planner bug cannot hide behind the same bug in its test.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import cache
from pathlib import Path

from hpcvm.host import HostTopology, discover, synthetic
from hpcvm.host.model import HugePagePool
from hpcvm.plan.model import PlanRequest, VMPlan
from hpcvm.units import GIB, KIB, MIB

SMALL = 4 * KIB
HUGE_PROFILES = ("hugepages", "numa", "hpc")
BOUND_PROFILES = ("numa", "hpc")


@cache
def host_from(kind: str, path: str) -> HostTopology:
    """discover() once per snapshot for the whole session (each call runs lstopo)."""
    if kind == "sysfs":
        return discover(sysfs_root=Path(path))
    return discover(xml=Path(path))


@cache
def synthetic_host(description: str) -> HostTopology:
    return synthetic(description)


def with_pools(host: HostTopology, size: int, *, total: int, free: int | None) -> HostTopology:
    """The host with a pool of ``size`` pages (``total``/``free``) on every normal node,
    replacing any pool of that size: a host whose huge page counts are known to the test."""
    nodes = []
    for node in host.nodes:
        others = tuple(p for p in node.hugepages if p.size_bytes != size)
        pool = HugePagePool(size_bytes=size, total=total, free=free)
        pools = (*others, pool) if node.kind == "normal" else others
        nodes.append(node.model_copy(update={"hugepages": pools}))
    return host.model_copy(update={"nodes": tuple(nodes)})


def roomy(host: HostTopology, memory: int = 32 * GIB) -> HostTopology:
    """The host with ``memory`` per normal node and plenty of free 2M and 1G pages (8G
    and 4G, leaving 20G of ordinary memory): a
    host on which any small plan fits, so a refusal can only come from the CPUs."""
    nodes = []
    for node in host.nodes:
        if node.kind == "normal":
            pools = (
                HugePagePool(size_bytes=2 * MIB, total=4096, free=4096),
                HugePagePool(size_bytes=GIB, total=4, free=4),
            )
            node = node.model_copy(
                update={"memory_bytes": memory, "hugepages": pools, "available_bytes": None}
            )
        nodes.append(node)
    return host.model_copy(update={"nodes": tuple(nodes)})


def usable_pus(host: HostTopology) -> set[int]:
    return {p.os_index for p in host.pus if p.online and p.allowed}


def usable_cores(host: HostTopology) -> dict[int | None, list[list[int]]]:
    """node (None: no node) -> its cores' usable PUs, ordered by their lowest usable PU."""
    usable = usable_pus(host)
    by_node: dict[int | None, list[list[int]]] = defaultdict(list)
    node_of = {p.os_index: p.node for p in host.pus}
    for core in sorted(host.cores, key=lambda c: min(c.pus)):
        pus = sorted(pu for pu in core.pus if pu in usable)
        if pus:
            by_node[node_of[pus[0]]].append(pus)
    for cores in by_node.values():
        cores.sort(key=lambda c: c[0])
    return dict(by_node)


def housekeeping_cores(request: PlanRequest) -> int:
    if request.profile != "hpc":
        return 0
    return 1 if request.housekeeping is None else request.housekeeping


def vcpu_capacity(host: HostTopology, request: PlanRequest) -> dict[int | None, int]:
    """node -> PUs available for vCPUs (usable, minus the hpc housekeeping cores; with
    --smt require only cores that have siblings, as the policy allows)."""
    k = housekeeping_cores(request)
    siblings_only = request.smt == "require"
    counts = {
        n: sum(len(c) for c in cores[k:] if not siblings_only or len(c) > 1)
        for n, cores in usable_cores(host).items()
    }
    return {n: count for n, count in counts.items() if count > 0}


def check_plan(host: HostTopology, request: PlanRequest, plan: VMPlan) -> None:
    """Every invariant of the planner's design; raises AssertionError naming the broken one."""
    assert plan.vcpus == request.vcpus and plan.memory_bytes == request.memory_bytes
    assert plan.profile == request.profile
    _check_topology(plan)
    _check_pins(host, request, plan)
    _check_memory_regions(plan, request)
    if request.profile in BOUND_PROFILES:
        _check_guest_nodes(host, plan)
    else:
        assert not plan.guest_nodes and not plan.guest_distances
        assert all(p.guest_node is None for p in plan.placements)
    _check_housekeeping(host, request, plan)
    _check_cpu_and_clock(plan)
    assert plan.decisions, "a plan explains itself"


def _check_topology(plan: VMPlan) -> None:
    t = plan.topology
    assert t.sockets * t.dies * t.cores * t.threads == plan.vcpus
    assert [p.vcpu for p in plan.placements] == list(range(plan.vcpus))
    for p in plan.placements:
        # QEMU cpu-index order: socket-major, then core, then thread
        index = ((p.socket * t.dies + p.die) * t.cores + p.core) * t.threads + p.thread
        assert index == p.vcpu, (
            f"vCPU {p.vcpu} at socket {p.socket} core {p.core} thread {p.thread}"
        )
    slots = Counter((p.socket, p.die, p.core, p.thread) for p in plan.placements)
    assert max(slots.values()) == 1
    if plan.profile == "naive":
        assert (t.sockets, t.cores, t.threads) == (1, plan.vcpus, 1)


def _check_pins(host: HostTopology, request: PlanRequest, plan: VMPlan) -> None:
    pus = [p.host_pu for p in plan.placements]
    if request.profile == "naive":
        assert all(pu is None for pu in pus)
        return
    assert all(pu is not None for pu in pus), "every vCPU pinned"
    pinned = [pu for pu in pus if pu is not None]
    assert len(set(pinned)) == len(pinned), "distinct PUs"
    assert set(pinned) <= usable_pus(host), "only online, allowed PUs"
    _check_smt_rule(host, request, plan)
    _check_fewest_nodes(host, request, plan)


def allowed_memory_nodes(host: HostTopology) -> set[int]:
    """Nodes guest memory may be bound to: allowed by cpuset.mems, with memory."""
    return {
        n.os_index for n in host.nodes if n.allowed and n.kind == "normal" and n.memory_bytes > 0
    }


def _local_capacity(host: HostTopology, request: PlanRequest) -> int:
    allowed = allowed_memory_nodes(host)
    return sum(c for n, c in vcpu_capacity(host, request).items() if n in allowed)


def _check_smt_rule(host: HostTopology, request: PlanRequest, plan: VMPlan) -> None:
    """--smt cores: one PU per physical core unless the candidate PUs (those with local
    allowed memory when they suffice, else all) have fewer cores than vCPUs; pack and
    require: a core's PUs filled before the next. Guest threads only for siblings."""
    k = housekeeping_cores(request)
    core_of = {pu: c.index for c in host.cores for pu in c.pus}
    node_of = {p.os_index: p.node for p in host.pus}
    pinned = plan.vcpu_pus()
    used_nodes = {node_of[pu] for pu in pinned}
    given = Counter(core_of[pu] for pu in pinned)
    deepest = max(given.values())
    cores = usable_cores(host)
    smt = request.smt or "cores"
    if smt == "cores":
        allowed = allowed_memory_nodes(host)
        local_only = _local_capacity(host, request) >= plan.vcpus
        tier = [n for n in cores if n in allowed] if local_only else list(cores)
        free_cores = sum(len(cores[n][k:]) for n in tier)
        if deepest > 1:
            assert free_cores < plan.vcpus, (
                f"SMT siblings used although {free_cores} free cores hold {plan.vcpus} vCPUs"
            )
        for core_pus in (c for n in used_nodes for c in cores[n][k:]):
            taken = given.get(core_of[core_pus[0]], 0)
            assert taken >= min(len(core_pus), deepest - 1), (
                f"a core gives {deepest} PUs while core {core_pus} gives only {taken}"
            )
    else:
        for n in used_nodes:
            eligible = [c for c in cores[n][k:] if smt == "pack" or len(c) > 1]
            counts = [given.get(core_of[c[0]], 0) for c in eligible]
            pairs = zip(eligible, counts, strict=True)
            partial = [c for c, t in pairs if 0 < t < len(c)]
            assert len(partial) <= 1, f"--smt {smt}: more than one core partly used on {n}"
            assert sum(counts) == sum(1 for pu in pinned if node_of[pu] == n), (
                f"--smt {smt}: a vCPU on a core the policy does not allow"
            )
    t = plan.topology.threads
    if t > 1:
        assert set(given.values()) == {t}, "guest threads only when every core gives t PUs"
        by_guest_core: dict[tuple[int, int, int], set[int]] = defaultdict(set)
        for p in plan.placements:
            assert p.host_pu is not None
            by_guest_core[p.socket, p.die, p.core].add(core_of[p.host_pu])
        assert all(len(cores) == 1 for cores in by_guest_core.values()), (
            "threads of one guest core are siblings of one host core"
        )


def _check_fewest_nodes(host: HostTopology, request: PlanRequest, plan: VMPlan) -> None:
    """The fewest domains (nodes, or the PUs without one) that hold the vCPUs by the
    policy's measure (free cores for --smt cores when they suffice, else PUs; with too
    few cores for --smt cores, every domain with free cores); more only when memory
    decided, which the plan must then say. Local memory first."""
    if request.passthrough:
        return  # the device's node comes first; checked in the passthrough tests
    node_of = {p.os_index: p.node for p in host.pus}
    used = {node_of[pu] for pu in plan.vcpu_pus()}
    allowed = allowed_memory_nodes(host)
    local_cap = _local_capacity(host, request)
    smt = request.smt or "cores"
    k = housekeeping_cores(request)
    cores = usable_cores(host)
    memory_said = any("memory decided" in d.text for d in plan.decisions)
    if local_cap >= plan.vcpus and not memory_said:
        assert used <= allowed, f"nodes without local memory {used - allowed} used needlessly"
    tier = [n for n in cores if n in allowed] if used <= allowed else list(cores)

    def measure(n: int | None) -> int:
        eligible = [c for c in cores[n][k:] if smt != "require" or len(c) > 1]
        if smt == "cores" and sum(len(cores[m][k:]) for m in tier) >= plan.vcpus:
            return len(eligible)
        return sum(len(c) for c in eligible)

    short = smt == "cores" and sum(len(cores[m][k:]) for m in tier) < plan.vcpus
    if short:
        # too few cores: every domain with free cores, so the fewest vCPUs share one
        with_cores = {n for n in tier if cores[n][k:]}
        assert used == with_cores or memory_said, (
            f"cores ran short but domains {with_cores - used} with free cores left out"
        )
        return
    caps = sorted((measure(n) for n in tier), reverse=True)
    if sum(caps[: len(used) - 1]) >= plan.vcpus:
        assert memory_said, (
            f"{len(used)} domains used where {len(used) - 1} could hold {plan.vcpus} vCPUs"
        )


def _check_memory_regions(plan: VMPlan, request: PlanRequest) -> None:
    page = plan.page_size_bytes
    assert sum(r.size_bytes for r in plan.memory) == plan.memory_bytes
    assert all(r.size_bytes % page == 0 and r.page_size_bytes == page for r in plan.memory)
    profile = request.profile
    default_page = 2 * MIB if profile in HUGE_PROFILES else SMALL
    assert page == (request.page_size_bytes or default_page)
    if profile in ("naive", "pinned"):
        (region,) = plan.memory
        assert region.backend == "ram" and not region.host_nodes and region.policy == "default"
        assert not plan.hugepages_needed
    elif profile == "hugepages":
        (region,) = plan.memory
        assert region.backend == "file" and region.mem_path and region.prealloc
        assert not region.host_nodes and region.policy == "default"
        assert sum(plan.hugepages_needed.values()) == plan.memory_bytes // page
    else:
        assert len(plan.memory) == len(plan.guest_nodes)
        for region in plan.memory:
            assert region.policy == "bind" and region.prealloc
            assert region.backend == ("file" if page > SMALL else "ram")
            assert (region.mem_path is not None) == (page > SMALL)


def _check_guest_nodes(host: HostTopology, plan: VMPlan) -> None:
    node_of = {p.os_index: p.node for p in host.pus}
    page = plan.page_size_bytes
    nodes = plan.guest_nodes
    assert [n.index for n in nodes] == list(range(len(nodes)))
    assert sorted(v for n in nodes for v in n.vcpus) == list(range(plan.vcpus))
    by_vcpu = {p.vcpu: p for p in plan.placements}
    regions = {r.guest_node: r for r in plan.memory}
    # whole MiB for small pages when the total is (a flavor's hw:numa_mem.N is in MiB)
    unit = MIB if page < MIB and plan.memory_bytes % MIB == 0 else page
    total_units = plan.memory_bytes // unit
    allowed = allowed_memory_nodes(host)
    for n in nodes:
        assert n.host_node in allowed, f"guest node {n.index} bound to barred {n.host_node}"
        for v in n.vcpus:
            pu = by_vcpu[v].host_pu
            assert pu is not None and node_of[pu] == n.cpu_node, (
                f"vCPU {v} of guest node {n.index} on PU {pu}, not on host node {n.cpu_node}"
            )
            assert by_vcpu[v].guest_node == n.index
        if n.cpu_node in allowed:
            assert n.local and n.host_node == n.cpu_node, "local memory where allowed"
        else:
            assert not n.local
            if n.cpu_node is not None:
                nearest = min(allowed, key=lambda a: (host.distance(n.cpu_node, a), a))  # type: ignore[arg-type]
                assert n.host_node == nearest, "memory on the nearest allowed node"
        region = regions[n.index]
        assert region.host_nodes == (n.host_node,) and region.size_bytes == n.memory_bytes
        exact = total_units * len(n.vcpus) / plan.vcpus
        assert n.memory_bytes % unit == 0, f"guest node memory in whole {unit // KIB}K"
        assert abs(n.memory_bytes // unit - exact) < 1, "memory in proportion to vCPUs"
    # vCPU counts per guest node even -> one socket per guest node
    counts = {len(n.vcpus) for n in nodes}
    if len(counts) == 1:
        assert plan.topology.sockets == len(nodes)
        assert all(by_vcpu[v].socket == n.index for n in nodes for v in n.vcpus)
    else:
        assert plan.topology.sockets == 1
    order = [(n.cpu_node is None, n.cpu_node or 0) for n in nodes]
    assert order == sorted(order), "guest nodes in host node order, PUs without a node last"
    for i, a in enumerate(nodes):
        for j, b in enumerate(nodes):
            want = host.distance(a.host_node, b.host_node)
            if i != j and a.host_node == b.host_node:
                want += 1  # Linux rejects remote == local
            assert plan.guest_distances[i][j] == want
    if page > SMALL:
        per_host: Counter[int] = Counter()
        for n in nodes:
            per_host[n.host_node] += n.memory_bytes // page
        assert dict(per_host) == plan.hugepages_needed
    else:
        assert not plan.hugepages_needed


def _check_housekeeping(host: HostTopology, request: PlanRequest, plan: VMPlan) -> None:
    if request.profile != "hpc":
        assert not plan.housekeeping_pus and not plan.emulator_pus and plan.iothreads == 0
        return
    k = housekeeping_cores(request)
    if k == 0:
        # no housekeeping cores: QEMU's threads share exactly the vCPU PUs
        assert not plan.housekeeping_pus
        assert set(plan.emulator_pus) == set(plan.iothread_pus) == set(plan.vcpu_pus())
        assert plan.iothreads == 1
        return
    node_of = {p.os_index: p.node for p in host.pus}
    hk = set(plan.housekeeping_pus)
    assert hk and not hk & set(plan.vcpu_pus()), "housekeeping disjoint from vCPUs"
    assert plan.emulator_pus == plan.iothread_pus == plan.housekeeping_pus
    assert plan.iothreads == 1
    used = {node_of[pu] for pu in plan.vcpu_pus()}
    expected = {pu for n in used for c in usable_cores(host)[n][:k] for pu in c}
    assert hk == expected, "the K lowest-numbered cores of each used node"


def _check_cpu_and_clock(plan: VMPlan) -> None:
    if plan.profile == "hpc" and plan.accel == "kvm":
        assert plan.cpu.model == "host" and "invtsc" in plan.cpu.features
        assert plan.clock == "kvm-clock"
    elif plan.profile == "hpc":
        assert plan.cpu.model == "max" and plan.clock == "tsc"
    else:
        assert plan.cpu.model is None
        assert (plan.clock == "kvm-clock") == (plan.accel == "kvm")
    if plan.accel == "tcg":
        assert any("TCG" in w for w in plan.warnings)
