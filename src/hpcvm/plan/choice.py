"""Which domains (host nodes, or the PUs without one) hold the vCPUs: CPUs and memory
decide together.

The search, in order of preference:
1. domains whose memory is local (their node is inside cpuset.mems) before the others;
2. the fewest domains that hold the vCPUs under the SMT policy: with ``--smt cores``
   one vCPU per physical core, so 16 vCPUs on 2 nodes x 8 cores x 2 threads use both
   nodes; siblings only when the candidate domains have fewer cores than vCPUs, and
   then every candidate domain, all cores before any sibling;
3. among sets of that size, the one around the first anchor (a passthrough device's
   node, else each domain in order) with its nearest neighbours by distance, whose
   every memory node holds its share of guest memory (free memory, or free huge pages
   of the plan's size) plus QEMU's overhead on the first;
4. when no set holds the memory in free pages, the same search against what the pools
   could hold once grown, so the refusal can say what to reserve where.

Pure: the memory test is a function handed in by the planner (``memory.memory_fits``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from hpcvm.plan.names import SmtPolicy
from hpcvm.plan.placement import CpuLayout, domain_distance, smt_cores, split_shares

# (memory node, vCPUs) per used domain, strict (free pages only) -> does the memory fit
MemoryFit = Callable[[Sequence[tuple[int, int]], bool], bool]


@dataclass(frozen=True)
class Choice:
    domains: tuple[int, ...]
    shares: tuple[int, ...]  # vCPUs per domain
    siblings_needed: bool  # --smt cores: fewer cores than vCPUs in the candidates
    local_only: bool  # only domains with local memory
    strict: bool  # memory fits in free memory / free huge pages


@dataclass(frozen=True)
class _Caps:
    search: dict[int, int]  # what a domain can hold (cores, or PUs)
    ranks: dict[int, list[int]]  # per rank, how many cores can give a PU (the split)
    siblings_needed: bool


def capacities(layout: CpuLayout, keys: Sequence[int], vcpus: int, smt: SmtPolicy) -> _Caps:
    cores = {k: smt_cores(layout.vcpu_cores[k], smt) for k in keys}
    pus = {k: sum(len(c) for c in cores[k]) for k in keys}
    if smt != "cores":
        return _Caps(pus, {k: [pus[k]] for k in keys}, siblings_needed=False)
    whole = {k: len(cores[k]) for k in keys}
    if sum(whole.values()) >= vcpus:
        return _Caps(whole, {k: [whole[k]] for k in keys}, siblings_needed=False)
    ranks = {k: _cores_per_rank(cores[k]) for k in keys}
    return _Caps(pus, ranks, siblings_needed=True)


def _cores_per_rank(cores: Sequence[tuple[int, ...]]) -> list[int]:
    """How many of ``cores`` have a first, second, ... PU (a cpuset can leave some
    cores fewer siblings than others)."""
    depth = max((len(c) for c in cores), default=0)
    return [sum(1 for c in cores if len(c) > r) for r in range(depth)]


def choose_domains(
    layout: CpuLayout,
    vcpus: int,
    required: Sequence[int],
    smt: SmtPolicy,
    distance: Mapping[tuple[int, int], int],
    fits: MemoryFit | None,
) -> Choice | None:
    """The preferred domains and vCPU shares, or None when no set holds the memory
    (the caller has checked that the CPUs fit somewhere)."""
    every = [k for k in layout.vcpu_cores if smt_cores(layout.vcpu_cores[k], smt)]
    local = [k for k in every if layout.local(k)]
    tiers = [(local, True)] if local else []
    if local != every:
        tiers.append((every, False))
    for strict in (True, False) if fits is not None else (True,):
        for keys, local_only in tiers:
            caps = capacities(layout, keys, vcpus, smt)
            if sum(caps.search.values()) < vcpus:
                continue
            wanted = [k for k in dict.fromkeys(required) if k in caps.search]
            for chosen in _sets(keys, wanted, caps, vcpus, distance):
                shares = split_shares(vcpus, [caps.ranks[k] for k in chosen])
                loads = [
                    (mem, s)
                    for k, s in zip(chosen, shares, strict=True)
                    if s > 0 and (mem := layout.mem_node[k]) is not None
                ]
                if fits is None or (loads and fits(loads, strict)):
                    return Choice(
                        tuple(chosen), tuple(shares), caps.siblings_needed, local_only, strict
                    )
    return None


def _sets(
    keys: Sequence[int],
    required: Sequence[int],
    caps: _Caps,
    vcpus: int,
    distance: Mapping[tuple[int, int], int],
) -> Iterator[list[int]]:
    """``candidate_sets``; under --smt cores with too few cores, every domain of the
    tier first: all their cores before any sibling, so the fewest vCPUs share a core
    (33 vCPUs on 4 nodes x 8 cores x 2 threads: 32 cores and one sibling, not 24 cores
    and nine siblings on the 3 nodes whose PUs would hold them). Smaller sets follow,
    for when memory rules the whole tier out."""
    if caps.siblings_needed:
        yield list(keys)
    yield from candidate_sets(keys, required, caps.search, vcpus, distance)


def candidate_sets(
    keys: Sequence[int],
    required: Sequence[int],
    caps: Mapping[int, int],
    vcpus: int,
    distance: Mapping[tuple[int, int], int],
) -> Iterator[list[int]]:
    """Sets of domains that hold ``vcpus`` by CPU, smallest first: ``required`` and the
    domains nearest an anchor (ties by number), then the largest domains. Each set in
    guest order (the order of ``keys``)."""
    rank = {k: i for i, k in enumerate(keys)}
    anchors = list(required[:1]) or list(keys)
    near = {
        a: sorted((k for k in keys if k != a), key=lambda k: (domain_distance(distance, a, k), k))
        for a in anchors
    }
    biggest = sorted((k for k in keys if k not in required), key=lambda k: (-caps[k], rank[k]))
    seen: set[frozenset[int]] = set()
    for count in range(max(1, len(required)), len(keys) + 1):
        options = []
        for anchor in anchors:
            chosen = list(dict.fromkeys([anchor, *required]))
            chosen += [k for k in near[anchor] if k not in chosen][: count - len(chosen)]
            options.append(chosen)
        options.append([*required, *biggest[: count - len(required)]])
        for chosen in options:
            key = frozenset(chosen)
            if key in seen or sum(caps[k] for k in chosen) < vcpus:
                continue
            seen.add(key)
            yield sorted(chosen, key=lambda k: rank[k])
