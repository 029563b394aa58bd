"""Which host PUs run the vCPUs, and which run QEMU's own threads.

Rules (the reference study's and the usual HPC practice):
- only online PUs inside this process's cpuset are usable; memory-only nodes hold none;
- usable PUs are grouped in *domains*: the PUs of one host node, or the PUs that have no
  node at all (their node is offline or absent). A domain's memory goes to its own node
  when cpuset.mems allows it ("local"), else to the nearest allowed node by distance;
- hpc reserves housekeeping first: the K lowest-numbered cores of every used domain, so
  QEMU's emulator and I/O threads never steal time from a vCPU;
- the SMT policy (``--smt``) decides how vCPUs meet SMT siblings (see SMT_POLICIES);
- domains are chosen by ``choice.choose_domains`` (CPUs and memory both decide).

Everything is computed from dicts built once, so a 1024-PU host plans in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcvm.errors import InfeasiblePlanError
from hpcvm.host.model import HostTopology
from hpcvm.plan.names import SmtPolicy
from hpcvm.units import format_cpu_list

NODELESS = -1  # domain key of the PUs that belong to no NUMA node
FAR = 10_000  # distance to or from the node-less domain: unknown, so farthest


@dataclass(frozen=True)
class CpuLayout:
    """The host's usable PUs grouped by domain and core, minus housekeeping."""

    # domain -> its cores with usable PUs (each a tuple of PUs), lowest-numbered first
    node_cores: dict[int, tuple[tuple[int, ...], ...]]
    # domain -> housekeeping cores (hpc), taken from the front of node_cores
    housekeeping: dict[int, tuple[tuple[int, ...], ...]]
    # domain -> cores left for vCPUs
    vcpu_cores: dict[int, tuple[tuple[int, ...], ...]]
    # domain -> the allowed node its memory is bound to (None: no node is allowed)
    mem_node: dict[int, int | None]

    def capacity(self, node: int) -> int:
        return sum(len(core) for core in self.vcpu_cores.get(node, ()))

    def local(self, node: int) -> bool:
        """The domain's PUs are local to the node its memory is bound to."""
        return node != NODELESS and self.mem_node.get(node) == node


def domain_name(key: int) -> str:
    return "the PUs without a node" if key == NODELESS else f"host node {key}"


def host_layout(
    host: HostTopology, housekeeping_cores: int, distance: Mapping[tuple[int, int], int]
) -> CpuLayout:
    """Group usable PUs by domain and core; reserve ``housekeeping_cores`` per domain."""
    grouped: dict[int, dict[int, list[int]]] = {}
    for pu in sorted(host.usable_pus(), key=lambda p: p.os_index):
        key = NODELESS if pu.node is None else pu.node
        grouped.setdefault(key, {}).setdefault(pu.core, []).append(pu.os_index)
    order = sorted(grouped, key=lambda k: (k == NODELESS, k))
    node_cores = {k: tuple(tuple(pus) for pus in grouped[k].values()) for k in order}
    housekeeping = {n: cores[:housekeeping_cores] for n, cores in node_cores.items()}
    vcpu_cores = {n: cores[housekeeping_cores:] for n, cores in node_cores.items()}
    mem_node = {k: memory_node(host, k, distance, node_cores[k]) for k in order}
    return CpuLayout(node_cores, housekeeping, vcpu_cores, mem_node)


def memory_node(
    host: HostTopology,
    key: int,
    distance: Mapping[tuple[int, int], int],
    cores: Sequence[tuple[int, ...]],
) -> int | None:
    """Where a domain's memory goes: its own node when allowed and holding memory;
    else the nearest such node by distance (ties: lowest number); for PUs without a
    node, one of their package's nodes, else the lowest (no distance exists for them)."""
    allowed = [n.os_index for n in host.allowed_nodes() if n.memory_bytes > 0]
    if not allowed:
        return None
    if key in allowed:
        return key
    if key != NODELESS:
        return min(allowed, key=lambda n: (distance[key, n], n))
    packages = {host.pu(pu).package for core in cores for pu in core}
    near = sorted(n for p in host.packages if p.os_index in packages for n in p.nodes)
    return next((n for n in near if n in allowed), allowed[0])


def why_not_local(host: HostTopology, key: int) -> str:
    """Why a domain's memory cannot be on its own node, in words."""
    if key == NODELESS:
        return "belong to no NUMA node (their node is offline or absent)"
    if not host.node(key).allowed:
        return f"are on host node {key}, outside cpuset.mems"
    return f"are on host node {key}, which has no memory"


def domain_distance(distance: Mapping[tuple[int, int], int], a: int, b: int) -> int:
    if a == b:
        return 0
    if NODELESS in (a, b):
        return FAR
    return distance[a, b]


@dataclass(frozen=True)
class Selection:
    """The chosen host side: domains, PUs per domain in vCPU order, SMT use."""

    nodes: tuple[int, ...]  # used domains (host node, or NODELESS last), guest order
    pus: dict[int, tuple[int, ...]]  # domain -> PUs in vCPU order
    cores: dict[int, tuple[tuple[int, ...], ...]]  # domain -> chosen PUs grouped by core
    threads: int  # t > 1 when every chosen core gives exactly t PUs (siblings adjacent)
    siblings_used: bool  # some chosen core gives more than one PU
    housekeeping_pus: tuple[int, ...]  # of the used domains (hpc), sorted
    mem_node: dict[int, int | None]  # domain -> the node its memory is bound to
    smt: SmtPolicy = "cores"


def too_many_vcpus(
    host: HostTopology, layout: CpuLayout, vcpus: int, housekeeping_cores: int
) -> InfeasiblePlanError:
    """The refusal for more vCPUs than usable PUs, saying why PUs are not usable."""
    usable = sum(layout.capacity(n) for n in layout.vcpu_cores)
    online = [p.os_index for p in host.pus if p.online]
    offline = [p.os_index for p in host.pus if not p.online]
    disallowed = [p.os_index for p in host.pus if p.online and not p.allowed]
    reserved = sum(len(c) for cores in layout.housekeeping.values() for c in cores)
    why = [f"{len(online)} online"]
    if disallowed:
        why.append(
            f"{len(disallowed)} outside this process's cpuset ({format_cpu_list(disallowed)})"
        )
    if reserved:
        why.append(f"{reserved} reserved for housekeeping with --housekeeping {housekeeping_cores}")
    detail = ", ".join(why)
    if offline:
        detail += f"; offline: {format_cpu_list(offline)}"
    asked = f"{vcpus} vCPU{'s' if vcpus != 1 else ''} requested"
    if usable:
        fix = f"use --vcpus {usable} or fewer"
    elif reserved:
        fix = "every usable core is a housekeeping core: use --profile numa"
    else:
        fix = "bring CPUs online or widen the cpuset"
    return InfeasiblePlanError(
        f"{asked} but only {usable} PU{'s are' if usable != 1 else ' is'} usable for vCPUs "
        f"({detail}): {fix}",
        cause="housekeeping" if reserved else "vcpus",
        # with every usable core reserved, only fewer housekeeping cores make room
        option="housekeeping" if reserved and not usable else "vcpus",
    )


def smt_cores(cores: Sequence[tuple[int, ...]], smt: SmtPolicy) -> tuple[tuple[int, ...], ...]:
    """The cores a policy may use: --smt require takes only cores with siblings."""
    if smt == "require":
        return tuple(c for c in cores if len(c) > 1)
    return tuple(cores)


def split_shares(total: int, ranks: Sequence[Sequence[int]]) -> list[int]:
    """Split ``total`` vCPUs over domains rank by rank: ``ranks[d][r]`` is how many
    cores of domain ``d`` have an (r+1)-th usable PU. Every core's r-th PU is taken,
    evenly over the domains, before any core's (r+1)-th, so no core gives a third
    sibling while another core (of any chosen domain) still has a second one free.
    With one rank (no siblings needed, or PUs counted flat) this is an even split."""
    shares = [0] * len(ranks)
    left = total
    for r in range(max((len(d) for d in ranks), default=0)):
        caps = [d[r] if r < len(d) else 0 for d in ranks]
        step = even_split(min(left, sum(caps)), caps)
        shares = [a + b for a, b in zip(shares, step, strict=True)]
        left -= sum(step)
    return shares


def even_split(total: int, caps: Sequence[int]) -> list[int]:
    """Split ``total`` over bins as evenly as possible without exceeding any cap; the
    remainder goes to the first bins. Assumes sum(caps) >= total."""
    shares = [0] * len(caps)
    remaining = total
    while remaining > 0:
        open_bins = [i for i, cap in enumerate(caps) if shares[i] < cap]
        quota, extra = divmod(remaining, len(open_bins))
        if quota == 0:
            for i in open_bins[:extra]:
                shares[i] += 1
            break
        for i in open_bins:
            add = min(quota, caps[i] - shares[i])
            shares[i] += add
            remaining -= add
    return shares


def pick_in_node(
    cores: Sequence[tuple[int, ...]], count: int, smt: SmtPolicy
) -> list[tuple[int, ...]]:
    """``count`` PUs from ``cores``, grouped by core (cores given none dropped).

    cores: the first PU of every core, then second PUs, ... (siblings last);
    pack/require: every PU of a core before the next core (siblings together)."""
    if smt != "cores":
        out: list[tuple[int, ...]] = []
        left = count
        for core in cores:
            if left == 0:
                break
            out.append(core[:left])
            left -= len(out[-1])
        return out
    taken = [0] * len(cores)
    left = count
    rank = 0
    depth = max((len(core) for core in cores), default=0)
    while left > 0 and rank < depth:
        for i, core in enumerate(cores):
            if left == 0:
                break
            if rank < len(core):
                taken[i] += 1
                left -= 1
        rank += 1
    return [core[:n] for core, n in zip(cores, taken, strict=True) if n]


def make_selection(
    layout: CpuLayout,
    domains: Sequence[int],
    shares: Sequence[int],
    smt: SmtPolicy,
) -> Selection:
    """The Selection for ``shares`` vCPUs on ``domains`` (a share of 0 drops it)."""
    picked = {
        n: pick_in_node(smt_cores(layout.vcpu_cores[n], smt), s, smt)
        for n, s in zip(domains, shares, strict=True)
        if s > 0
    }
    nodes = tuple(n for n in layout.vcpu_cores if n in picked)  # guest order
    per_core = [len(core) for n in nodes for core in picked[n]]
    threads = per_core[0] if len(set(per_core)) == 1 else 1
    pus = {n: _vcpu_order(picked[n], threads) for n in nodes}
    housekeeping = sorted(pu for n in nodes for core in layout.housekeeping[n] for pu in core)
    return Selection(
        nodes=nodes,
        pus=pus,
        cores={n: tuple(picked[n]) for n in nodes},
        threads=threads,
        siblings_used=max(per_core) > 1,
        housekeeping_pus=tuple(housekeeping),
        mem_node={n: layout.mem_node[n] for n in nodes},
        smt=smt,
    )


def _vcpu_order(cores: Sequence[tuple[int, ...]], threads: int) -> tuple[int, ...]:
    """PUs in vCPU order. With guest threads, a core's PUs are adjacent vCPUs (guest
    siblings); otherwise first PUs of all cores, then any second PUs, as picked."""
    if threads > 1:
        return tuple(pu for core in cores for pu in core)
    depth = max(len(core) for core in cores)
    return tuple(core[r] for r in range(depth) for core in cores if r < len(core))
