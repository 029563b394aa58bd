"""The words for the CPU choices: which nodes and why, the SMT policy and whether
siblings were used, where each vCPU runs. Each sentence names numbers a person can
check against ``hpcvm host`` (cores per node, allowed memory nodes, CPUs without a node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hpcvm.host.model import HostTopology
from hpcvm.plan.choice import Choice, choose_domains
from hpcvm.plan.model import NOVA_THREAD_POLICY
from hpcvm.plan.notes import Notes
from hpcvm.plan.placement import (
    NODELESS,
    CpuLayout,
    Selection,
    domain_name,
    smt_cores,
    why_not_local,
)
from hpcvm.plan.topology import GuestCpus
from hpcvm.units import format_cpu_list


def _names(keys: Sequence[int]) -> str:
    nodes = [k for k in keys if k != NODELESS]
    text = f"host node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))}" if nodes else ""
    if NODELESS in keys:
        text = f"{text} and the PUs without a node" if text else "the PUs without a node"
    return text


def explain_selection(
    host: HostTopology,
    vcpus: int,
    layout: CpuLayout,
    selection: Selection,
    choice: Choice,
    prefer: Sequence[int],
    distance: Mapping[tuple[int, int], int],
    notes: Notes,
) -> None:
    """Decisions (and warnings) on the domains, the SMT policy and memory locality."""
    _explain_smt(layout, vcpus, selection, choice, notes)
    used = selection.nodes
    unit = "cores" if selection.smt == "cores" and not choice.siblings_needed else "PUs"
    held = sum(len(c) for n in used for c in smt_cores(layout.vcpu_cores[n], selection.smt))
    if selection.smt == "cores" and not choice.siblings_needed:
        held = sum(len(smt_cores(layout.vcpu_cores[n], "cores")) for n in used)
    first = f"the passthrough device's node {prefer[0]} first, then " if prefer else ""
    text = (
        f"{_names(used)} chosen: {first}the fewest nodes whose free {unit} ({held}) hold "
        f"{vcpus} vCPUs, nearest to each other by NUMA distance, vCPUs split as evenly as "
        "they fit"
    )
    if selection.smt == "cores" and choice.siblings_needed and set(used) == _tier(layout, choice):
        cores = sum(len(smt_cores(layout.vcpu_cores[n], "cores")) for n in used)
        text = (
            f"{_names(used)} chosen: every node with free cores, as their {cores} cores "
            f"are fewer than {vcpus} vCPUs: each core's first PU before any sibling, "
            "over all of them"
        )
    cpu_only = choose_domains(layout, vcpus, prefer, selection.smt, distance, None)
    if cpu_only is not None and len(cpu_only.domains) < len(choice.domains):
        text += (
            f"; memory decided too: {len(cpu_only.domains)} node(s) would hold the vCPUs but "
            "not their share of guest memory plus QEMU's overhead"
        )
    elif cpu_only is not None and set(cpu_only.domains) != set(choice.domains):
        text += (
            f"; memory decided too: {_names(cpu_only.domains)} would hold the vCPUs but not "
            "their share of guest memory plus QEMU's overhead"
        )
    if not choice.strict:
        text += "; no choice holds the memory in free huge pages, so the pools must grow"
    notes.decide("nodes", text)
    _explain_locality(host, layout, selection, choice, notes)


def _tier(layout: CpuLayout, choice: Choice) -> set[int]:
    """The domains the choice was made among: those with free cores, local ones only
    when the choice kept to them."""
    return {
        k
        for k, cores in layout.vcpu_cores.items()
        if smt_cores(cores, "cores") and (layout.local(k) or not choice.local_only)
    }


def _explain_smt(
    layout: CpuLayout, vcpus: int, selection: Selection, choice: Choice, notes: Notes
) -> None:
    policy = selection.smt
    nova = NOVA_THREAD_POLICY[policy]
    head = f"--smt {policy} (OpenStack hw:cpu_thread_policy={nova})"
    smt_host = any(len(c) > 1 for cores in layout.vcpu_cores.values() for c in cores)
    if policy == "cores":
        if choice.siblings_needed:
            cores = sum(len(cs) for cs in layout.vcpu_cores.values())
            text = (
                f"{head}: one vCPU per physical core first, but the usable host has only "
                f"{cores} free cores for {vcpus} vCPUs, so {vcpus - cores} vCPU(s) share "
                "a core with another vCPU as SMT siblings"
            )
            notes.warn(
                f"{vcpus - cores} vCPU(s) run on SMT siblings of other vCPUs' cores ({vcpus} "
                f"vCPUs, {cores} free physical cores on this host): siblings share a core's "
                f"execution units; --vcpus {cores} gives every vCPU a core of its own"
            )
        elif smt_host:
            text = (
                f"{head}: one vCPU per physical core, over as many nodes as that takes; "
                "SMT siblings left idle, because two vCPUs on one core share its execution "
                "units (use --smt pack to fill siblings on fewer nodes)"
            )
        else:
            text = f"{head}: one vCPU per physical core; the host's cores have no SMT siblings"
    elif policy == "pack":
        text = (
            f"{head}: every PU of a core before the next core, on the fewest nodes: "
            "siblings hold vCPUs together (more vCPUs per node, less per-core throughput)"
        )
        if selection.siblings_used:
            notes.warn(
                "--smt pack: vCPUs share physical cores as SMT siblings (requested): "
                "siblings share a core's execution units"
            )
    else:
        text = (
            f"{head}: only cores whose SMT siblings are all usable, every PU of a core "
            "before the next, so vCPUs come in sibling groups"
        )
    notes.decide("smt", text)


def _explain_locality(
    host: HostTopology, layout: CpuLayout, selection: Selection, choice: Choice, notes: Notes
) -> None:
    barred = [n.os_index for n in host.nodes if not n.allowed]
    if barred:
        allowed = format_cpu_list([n.os_index for n in host.allowed_nodes()]) or "none"
        notes.decide(
            "memory",
            f"host nodes {format_cpu_list(barred)} are outside this process's memory set "
            f"(cgroup cpuset.mems): no guest memory is bound there, only to nodes {allowed}",
        )
    far = [n for n in selection.nodes if not layout.local(n)]
    if not far:
        return
    why = (
        "the PUs whose local node is allowed hold too few vCPUs (or not their memory)"
        if any(layout.local(n) for n in layout.vcpu_cores)
        else "no usable PU has an allowed local node"
    )
    for n in far:
        mem = selection.mem_node[n]
        notes.decide(
            "memory",
            f"PUs that {why_not_local(host, n)} used because {why}: their vCPUs' memory "
            f"is bound to host node {mem}, "
            + (
                "an allowed node of their package (else the lowest allowed), as no distance "
                "is known for them"
                if n == NODELESS
                else f"the nearest allowed node (distance {host.distance(n, mem)})"
                if mem is not None
                else "nowhere"
            ),
        )
        notes.warn(
            f"vCPUs on {domain_name(n)} have no local memory: their memory is on host node "
            f"{mem}, so every access crosses the interconnect"
        )


def describe_pinning(
    guest: GuestCpus, selection: Selection, layout: CpuLayout, notes: Notes
) -> None:
    by_node: dict[int, list[tuple[int, int]]] = {}
    node_of_pu = {pu: n for n, pus in selection.pus.items() for pu in pus}
    for p in guest.placements:
        assert p.host_pu is not None
        by_node.setdefault(node_of_pu[p.host_pu], []).append((p.vcpu, p.host_pu))
    for node, pairs in by_node.items():
        vcpus = format_cpu_list([v for v, _ in pairs])
        pus = ",".join(str(pu) for _, pu in pairs)
        cores = selection.cores[node]
        deep = sum(1 for c in cores if len(c) > 1)
        smt = any(len(c) > 1 for c in layout.vcpu_cores[node])
        if deep:
            how = f"{len(cores)} physical cores, {deep} of them with SMT siblings pinned too"
        elif smt:
            how = "one PU per physical core; SMT siblings left idle"
        else:
            how = "one PU per physical core; the cores have no SMT siblings"
        notes.decide("vcpus", f"vCPU {vcpus} -> host PUs {pus} on {domain_name(node)} ({how})")
