"""The guest side of the CPUs: -smp topology, vNUMA nodes and each vCPU's place.

The guest must see what is pinned: vCPUs on SMT siblings of one host core become
threads of one guest core only when every chosen core gives the same number of PUs
(otherwise a guest core would mix sibling and non-sibling vCPUs); guest sockets are the
guest nodes when the vCPUs split evenly, so the guest scheduler's domains match the
host's. vCPU numbers follow QEMU's cpu-index order: socket-major, then core, thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcvm.errors import UsageError
from hpcvm.plan.model import CpuTopology, VcpuPlacement
from hpcvm.plan.notes import Notes
from hpcvm.plan.placement import Selection, domain_name


@dataclass(frozen=True)
class GuestCpus:
    topology: CpuTopology
    placements: tuple[VcpuPlacement, ...]
    # per guest node, in order: (host node, its vCPU ids); empty for a flat guest
    nodes: tuple[tuple[int, tuple[int, ...]], ...]


def naive_guest(vcpus: int, notes: Notes) -> GuestCpus:
    """QEMU 7.2's reading of a bare ``-smp N``: one socket of N single-thread cores."""
    topo = CpuTopology(sockets=1, cores=vcpus, threads=1)
    notes.decide(
        "topology",
        f"guest topology: 1 socket x {vcpus} cores x 1 thread, what QEMU 7.2 makes of "
        f"-smp {vcpus}; vCPUs not pinned (the host scheduler moves them)",
    )
    return GuestCpus(topology=topo, placements=_placements(topo, [None] * vcpus, []), nodes=())


def flat_guest(selection: Selection, notes: Notes) -> GuestCpus:
    """A pinned guest without NUMA: one socket; threads per the SMT rule."""
    pus = [pu for node in selection.nodes for pu in selection.pus[node]]
    threads = selection.threads
    topo = CpuTopology(sockets=1, cores=len(pus) // threads, threads=threads)
    notes.decide("topology", _topology_text(topo, threads, selection, flat=True))
    return GuestCpus(topology=topo, placements=_placements(topo, pus, []), nodes=())


def numa_guest(selection: Selection, guest_nodes: int | None, notes: Notes) -> GuestCpus:
    """Guest nodes mirroring the used host nodes (``guest_nodes`` per the request)."""
    used = selection.nodes
    per_host = _guest_nodes_per_host(guest_nodes, used)
    chunks: list[tuple[int, list[int]]] = []  # (host node, PUs) per guest node
    for node in used:
        pus = list(selection.pus[node])
        sizes = _even_parts(len(pus), per_host)
        if min(sizes) < 1:
            raise UsageError(
                f"--guest-nodes {guest_nodes} puts {per_host} guest nodes on {domain_name(node)}, "
                f"which holds only {len(pus)} of the vCPUs: "
                "use fewer --guest-nodes or more --vcpus",
                option="guest_nodes",
            )
        start = 0
        for size in sizes:
            chunks.append((node, pus[start : start + size]))
            start += size
    threads = selection.threads
    if threads > 1 and any(len(c) % threads for _, c in chunks):
        notes.decide(
            "topology",
            f"guest threads 1 although every chosen core gives {threads} PUs: the split into "
            f"{len(chunks)} guest nodes would put one core's siblings into two guest nodes",
        )
        threads = 1
    even = len({len(c) for _, c in chunks}) == 1
    sockets = len(chunks) if even else 1
    vcpus = sum(len(c) for _, c in chunks)
    topo = CpuTopology(sockets=sockets, cores=vcpus // (sockets * threads), threads=threads)
    pus = [pu for _, c in chunks for pu in c]
    owners = [g for g, (_, c) in enumerate(chunks) for _ in c]
    placements = _placements(topo, pus, owners)
    nodes: list[tuple[int, tuple[int, ...]]] = []
    first = 0
    for host_node, c in chunks:
        nodes.append((host_node, tuple(range(first, first + len(c)))))
        first += len(c)
    text = _topology_text(topo, threads, selection, flat=False)
    if sockets == 1 and len(chunks) > 1:
        text += (
            f"; one socket because the guest nodes hold unequal vCPU counts "
            f"({', '.join(str(len(c)) for _, c in chunks)})"
        )
    elif len(chunks) > 1:
        text += "; one socket per guest node"
    notes.decide("topology", text)
    return GuestCpus(topology=topo, placements=placements, nodes=tuple(nodes))


def _guest_nodes_per_host(guest_nodes: int | None, used: Sequence[int]) -> int:
    if guest_nodes is None:
        return 1
    if guest_nodes % len(used):
        options = sorted({len(used), len(used) * max(1, guest_nodes // len(used))})
        raise UsageError(
            f"--guest-nodes {guest_nodes} is not a multiple of the {len(used)} host nodes "
            f"the vCPUs use ({', '.join(domain_name(n) for n in used)}): use --guest-nodes "
            + " or ".join(map(str, options)),
            option="guest_nodes",
        )
    return guest_nodes // len(used)


def _even_parts(total: int, parts: int) -> list[int]:
    quota, extra = divmod(total, parts)
    return [quota + (1 if i < extra else 0) for i in range(parts)]


def _placements(
    topo: CpuTopology, pus: Sequence[int | None], owners: Sequence[int]
) -> tuple[VcpuPlacement, ...]:
    per_socket = topo.cores * topo.threads
    return tuple(
        VcpuPlacement(
            vcpu=v,
            socket=v // per_socket,
            core=(v // topo.threads) % topo.cores,
            thread=v % topo.threads,
            guest_node=owners[v] if owners else None,
            host_pu=pu,
        )
        for v, pu in enumerate(pus)
    )


def _topology_text(topo: CpuTopology, threads: int, selection: Selection, *, flat: bool) -> str:
    shape = f"{topo.sockets} socket(s) x {topo.cores} cores x {topo.threads} thread(s)"
    if threads > 1:
        why = (
            f"every chosen host core gives {threads} SMT siblings, shown as threads of one "
            "guest core (adjacent vCPUs)"
        )
    elif selection.siblings_used:
        why = (
            "threads 1: some chosen cores give one PU and some give two, so siblings "
            "cannot all be shown as guest threads"
        )
    else:
        why = "threads 1: one PU per physical core, no SMT siblings pinned"
    kind = "flat guest (no NUMA)" if flat else "guest"
    return f"{kind} topology: {shape} ({why})"


def guest_distances(
    host_nodes: Sequence[int], distance: Mapping[tuple[int, int], int], notes: Notes
) -> tuple[tuple[int, ...], ...]:
    """Guest node distances: the host's between their host nodes; guest nodes sharing
    one host node are one step above local, because Linux rejects a SLIT whose remote
    distance equals the local one (10) and would ignore the whole table."""
    rows = []
    shared = False
    for i, a in enumerate(host_nodes):
        row = []
        for j, b in enumerate(host_nodes):
            if i != j and a == b:
                row.append(distance[a, a] + 1)
                shared = True
            else:
                row.append(distance[a, b])
        rows.append(tuple(row))
    if shared:
        notes.decide(
            "numa",
            "guest nodes on the same host node are at distance local+1 (e.g. 11): Linux "
            "rejects a distance table whose remote distance equals the local 10",
        )
    return tuple(rows)
