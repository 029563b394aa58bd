"""``verify``: does the running VM match its plan? Observed from inside and outside.

Inside (one guest-agent call, runtime/verify/guest_sysfs.py): online CPUs, CPU topology, NUMA
nodes with their CPUs, memory and distances, the clocksource. Outside (runtime/
verify/observe.py): each vCPU thread's and QEMU's other threads' affinity, the huge pages the
QEMU process holds per host node, and on which host nodes its bound memory lies.

With NICs, verify/nics.py checks them from inside; for the built-in guest,
verify/shares.py checks what it sees of the host. What a check is: verify/checks.py.

The checks are a list of small pure functions ``(plan, observed) -> list[Check]`` over
an ``Observed`` snapshot; ``gather`` does all the I/O first. So each check is testable on
captured text, and adding one is adding a function to ``CHECKS``.

Guest memory per node is compared with a tolerance the guest kernel explains (measured
on this machine with Debian 12's 6.1 kernel under QEMU 7.2, see ``memory_floor``):
MemTotal never exceeds what was planned, and falls short by the struct-page array
(64 bytes per 4 KiB page, 1.6%) on every node plus the kernel image and early boot
allocations (48-51 MiB measured for 256 MiB to 2 GiB guests), which sit on one node
that KASLR chooses: a 2 x 128 MiB guest showed 127,564 kB on node 0 but 83,148 kB on
node 1. A fixed percentage (e.g. 85%) would fail small nodes for no fault of the VM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpcvm.errors import HpcvmError, RuntimeFailure
from hpcvm.plan.model import MemoryRegion, VMPlan
from hpcvm.runtime.backends.registry import get_backend
from hpcvm.runtime.machine.model import Backend, Machine
from hpcvm.runtime.verify import guest_sysfs, observe
from hpcvm.runtime.verify.checks import Check, GuestExec, VerifyReport
from hpcvm.runtime.verify.checks import check as _check
from hpcvm.runtime.verify.guest_sysfs import GuestFacts
from hpcvm.runtime.verify.nics import check_nics
from hpcvm.runtime.verify.shares import check_shares
from hpcvm.units import MIB, format_cpu_list, format_size, human_size

GUEST_TIMEOUT = 120.0  # one guest-exec under TCG on a busy 2-core host
MEMMAP_FRACTION = 0.02  # struct page: 64 B per 4 KiB page = 1.56%, rounded up
KERNEL_RESERVE = 64 * MIB  # kernel image + early allocations: 48-51 MiB measured


@dataclass(frozen=True)
class Observed:
    """Everything the checks look at, gathered once."""

    guest: GuestFacts | None  # None when the guest could not be read
    guest_error: str = ""
    vcpu_threads: dict[int, int] = field(default_factory=dict)  # vCPU -> host tid
    threads: tuple[observe.ThreadInfo, ...] = ()
    mappings: tuple[observe.Mapping, ...] = ()


CheckFn = Callable[[VMPlan, Observed], list[Check]]


def check_guest_read(plan: VMPlan, seen: Observed) -> list[Check]:
    """A guest that cannot be read fails verification (every guest check is skipped)."""
    if seen.guest is not None:
        return []
    return [
        _check("guest readable", "sysfs read through the agent", "failed", False, seen.guest_error)
    ]


def check_cpu_count(plan: VMPlan, seen: Observed) -> list[Check]:
    if seen.guest is None:
        return []
    online = len(seen.guest.online)
    ok = online == plan.vcpus and seen.guest.nproc in (None, plan.vcpus)
    return [_check("online CPUs", plan.vcpus, online, ok, f"nproc {seen.guest.nproc}")]


def observed_topology(facts: GuestFacts) -> tuple[int, int, int, int]:
    """(sockets, dies per socket, cores per die, threads per core) from sysfs topology."""
    cpus = list(facts.cpus.values())
    if not cpus:
        return (0, 0, 0, 0)
    sockets = len({c.package for c in cpus})
    dies = len({(c.package, c.die) for c in cpus})
    cores = len({(c.package, c.die, c.core) for c in cpus})
    threads = max(len(c.siblings) for c in cpus)
    return sockets, dies // sockets, cores // dies, threads


def check_topology(plan: VMPlan, seen: Observed) -> list[Check]:
    if seen.guest is None:
        return []
    t = plan.topology
    want = (t.sockets, t.dies, t.cores, t.threads)
    got = observed_topology(seen.guest)

    def words(v: tuple[int, int, int, int]) -> str:
        return f"{v[0]} sockets, {v[1]} dies, {v[2]} cores, {v[3]} threads"

    return [_check("CPU topology", words(want), words(got), want == got)]


def planned_nodes(plan: VMPlan) -> list[tuple[int, tuple[int, ...], int]]:
    """(guest node, its vCPUs, its memory): a flat guest is one node with everything."""
    if not plan.guest_nodes:
        return [(0, tuple(range(plan.vcpus)), plan.memory_bytes)]
    return [(n.index, n.vcpus, n.memory_bytes) for n in plan.guest_nodes]


def check_numa_nodes(plan: VMPlan, seen: Observed) -> list[Check]:
    if seen.guest is None:
        return []
    want = [n for n, _cpus, _mem in planned_nodes(plan)]
    got = sorted(seen.guest.nodes)
    return [_check("NUMA nodes", _nodes(want), _nodes(got), want == got)]


def _nodes(nodes: Sequence[int]) -> str:
    return f"{len(nodes)} ({format_cpu_list(list(nodes))})" if nodes else "0"


def check_node_cpus(plan: VMPlan, seen: Observed) -> list[Check]:
    if seen.guest is None:
        return []
    out = []
    for index, vcpus, _mem in planned_nodes(plan):
        node = seen.guest.nodes.get(index)
        got = format_cpu_list(node.cpus) if node else "missing"
        want = format_cpu_list(vcpus)
        out.append(_check(f"node {index} CPUs", want or "none", got or "none", got == want))
    return out


def memory_floor(planned: int) -> int:
    """The least MemTotal a guest node of ``planned`` bytes may show (module doc)."""
    return max(0, int(planned * (1 - MEMMAP_FRACTION)) - KERNEL_RESERVE)


def _memory_check(name: str, planned: int, got: int | None) -> Check:
    floor = memory_floor(planned)
    ok = got is not None and floor <= got <= planned
    actual = human_size(got) if got is not None else "unreadable"
    detail = f"allowed {human_size(floor)} to {human_size(planned)} (the kernel keeps the rest)"
    return _check(name, human_size(planned), actual, ok, detail)


def check_node_memory(plan: VMPlan, seen: Observed) -> list[Check]:
    if seen.guest is None:
        return []
    out = []
    for index, _vcpus, planned in planned_nodes(plan):
        node = seen.guest.nodes.get(index)
        got = node.mem_total_bytes if node is not None else None
        out.append(_memory_check(f"node {index} memory", planned, got))
    totals = [n.mem_total_bytes for n in seen.guest.nodes.values()]
    total = None if not totals or None in totals else sum(t for t in totals if t is not None)
    out.append(_memory_check("guest memory", plan.memory_bytes, total))
    return out


def check_distances(plan: VMPlan, seen: Observed) -> list[Check]:
    if seen.guest is None or not plan.guest_nodes:
        return []
    out = []
    for node in plan.guest_nodes:
        want = " ".join(str(d) for d in plan.guest_distances[node.index])
        facts = seen.guest.nodes.get(node.index)
        got = " ".join(str(d) for d in facts.distances) if facts else "missing"
        out.append(_check(f"node {node.index} distances", want, got, want == got))
    return out


# What planned clocks mean: the planner writes "default" when the guest kernel may pick
# any clocksource (TCG without the hpc profile); any other value names the clocksource.
FREE_CLOCKS = ("default", "")


def check_clock(plan: VMPlan, seen: Observed) -> list[Check]:
    if seen.guest is None:
        return []
    got = seen.guest.clocksource or "unreadable"
    if plan.clock in FREE_CLOCKS:
        ok = seen.guest.clocksource is not None
        return [_check("clocksource", "the guest kernel's choice", got, ok)]
    return [_check("clocksource", plan.clock, got, got == plan.clock)]


# -- host-side checks ---------------------------------------------------------------------


def _pus(pus: frozenset[int] | Sequence[int]) -> str:
    return format_cpu_list(sorted(pus))


def check_vcpu_pins(plan: VMPlan, seen: Observed) -> list[Check]:
    by_tid = {t.tid: t for t in seen.threads}
    out = []
    for p in plan.placements:
        if p.host_pu is None:
            continue
        tid = seen.vcpu_threads.get(p.vcpu)
        thread = by_tid.get(tid) if tid is not None else None
        got = _pus(thread.pus) if thread else "no thread"
        detail = f"tid {tid}" if tid is not None else "QEMU reports no thread for it"
        out.append(_check(f"vCPU {p.vcpu} affinity", p.host_pu, got, got == str(p.host_pu), detail))
    return out


def check_emulator_pins(plan: VMPlan, seen: Observed) -> list[Check]:
    """QEMU's non-vCPU threads on ``emulator_pus`` (I/O threads may use ``iothread_pus``)."""
    if not plan.emulator_pus:
        return []
    vcpu_tids = set(seen.vcpu_threads.values())
    allowed = {frozenset(plan.emulator_pus)}
    if plan.iothread_pus:
        allowed.add(frozenset(plan.iothread_pus))
    others = [t for t in seen.threads if t.tid not in vcpu_tids]
    wrong = [t for t in others if t.pus not in allowed]
    seen_sets = sorted({_pus(t.pus) for t in others})
    named = ", ".join(f"{t.name} (tid {t.tid}) on {_pus(t.pus)}" for t in wrong[:3])
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    detail = f"{len(wrong)} of {len(others)} threads off: {named}{more}" if wrong else ""
    return [
        _check(
            "emulator threads affinity",
            _pus(plan.emulator_pus),
            " / ".join(seen_sets) or "no threads",
            not wrong and bool(others),
            detail,
        )
    ]


def _huge_regions(plan: VMPlan) -> list[MemoryRegion]:
    return [r for r in plan.memory if r.backend == "file"]


def check_hugepages(plan: VMPlan, seen: Observed) -> list[Check]:
    """QEMU's own huge pages per host node (numa_maps) against ``hugepages_needed``;
    exact when every huge region is preallocated, at most the plan otherwise."""
    regions = _huge_regions(plan)
    size = plan.page_size_bytes
    used = observe.huge_pages_by_node(seen.mappings, size)
    if not regions:
        any_huge = sum(c for m in seen.mappings if m.huge for c in m.pages.values())
        return [_check("huge pages", "none", any_huge or "none", any_huge == 0)]
    exact = all(r.prealloc for r in regions)
    out = []
    for node in sorted(set(plan.hugepages_needed) | set(used)):
        want = plan.hugepages_needed.get(node, 0)
        got = used.get(node, 0)
        ok = got == want if exact else got <= want
        pool = observe.host_pool(node, size)
        detail = f"host pool {pool[0]} total, {pool[1]} free" if pool else ""
        out.append(
            _check(
                f"huge pages ({format_size(size)}) on host node {node}",
                want if exact else f"<= {want}",
                got,
                ok,
                detail,
            )
        )
    return out


def check_memory_placement(plan: VMPlan, seen: Observed) -> list[Check]:
    """Bound memory lies on its host nodes only, and as much of it is mapped as planned.

    numa_maps does not name QEMU's backends, so regions are grouped by what it does
    show: the bound node set and the page size (two guest nodes bound to the same host
    node are indistinguishable there, and the kernel may merge adjacent mappings).
    """
    groups: dict[tuple[frozenset[int], bool, int], int] = {}
    for r in plan.memory:
        if r.policy == "bind" and r.host_nodes:
            key = (frozenset(r.host_nodes), r.backend == "file", r.page_size_bytes)
            groups[key] = groups.get(key, 0) + r.size_bytes
    out = []
    for (nodes, huge, page), planned in sorted(groups.items(), key=lambda kv: sorted(kv[0][0])):
        maps = [
            m
            for m in seen.mappings
            if m.policy == "bind"
            and m.policy_nodes == nodes
            and m.huge == huge
            and m.page_size == page
        ]
        mapped = sum(m.size for m in maps)
        stray = {n: b for m in maps for n, b in m.bytes_by_node.items() if n not in nodes}
        ok = mapped == planned and not stray
        where = ", ".join(f"node {n}: {format_size(b)}" for n, b in sorted(stray.items()))
        actual = f"{format_size(mapped)} mapped" + (
            f", pages off-node ({where})" if stray else ", all on bound nodes"
        )
        out.append(
            _check(
                f"memory bound to host node {_pus(nodes)} ({format_size(page)} pages)",
                f"{format_size(planned)} on node {_pus(nodes)} only",
                actual,
                ok,
                f"{len(maps)} mapping(s) with policy bind:{_pus(nodes)}",
            )
        )
    return out


GUEST_RAM_FLOOR = 16 * MIB  # bound mappings this large are guest RAM, not QEMU's own


def check_unplanned_binding(plan: VMPlan, seen: Observed) -> list[Check]:
    """Guest RAM bound where the plan binds nothing: a VM started from another plan, or
    bound by hand (numactl, a libvirt edit). Without this, a plan saying node 1 for a
    VM whose memory is bound to node 0 would only show as "0 mapped on node 1"; here
    the node that really holds it is named, from the pages the kernel reports (N0=...).
    """
    planned = {frozenset(r.host_nodes) for r in plan.memory if r.policy == "bind"}
    stray = [
        m
        for m in seen.mappings
        if m.policy == "bind" and m.size >= GUEST_RAM_FLOOR and m.policy_nodes not in planned
    ]
    if not stray:
        return []
    on: dict[int, int] = {}
    for m in stray:
        for node, size in m.bytes_by_node.items():
            on[node] = on.get(node, 0) + size
    bound = sorted({_pus(m.policy_nodes) for m in stray})
    where = ", ".join(f"node {n}: {format_size(b)}" for n, b in sorted(on.items())) or "none yet"
    planned_text = " / ".join(sorted(_pus(n) for n in planned)) or "none"
    return [
        _check(
            "memory bound outside the plan",
            f"guest memory bound only to host node {planned_text}",
            f"{format_size(sum(m.size for m in stray))} bound to node {', '.join(bound)} "
            f"(pages on {where})",
            False,
            f"{len(stray)} mapping(s) with a binding the plan does not have",
        )
    ]


CHECKS: tuple[CheckFn, ...] = (
    check_guest_read,
    check_cpu_count,
    check_topology,
    check_numa_nodes,
    check_node_cpus,
    check_node_memory,
    check_distances,
    check_clock,
    check_vcpu_pins,
    check_emulator_pins,
    check_hugepages,
    check_memory_placement,
    check_unplanned_binding,
)


def run_checks(plan: VMPlan, seen: Observed) -> list[Check]:
    return [check for fn in CHECKS for check in fn(plan, seen)]


# -- gathering (I/O) --------------------------------------------------------------------


def read_guest(agent: GuestExec) -> tuple[GuestFacts | None, str]:
    """The guest's sysfs facts through the agent, or None and why not."""
    try:
        result = agent.exec(list(guest_sysfs.ARGV), timeout=GUEST_TIMEOUT)
    except HpcvmError as exc:
        return None, exc.message
    facts = guest_sysfs.parse_facts(result.stdout)
    if not facts.online:
        why = result.stderr.strip().splitlines()
        return None, f"exit {result.exit_code}: {why[-1] if why else 'no output'}"
    return facts, ""


def gather(machine: Machine, agent: GuestExec, backend: Backend) -> Observed:
    """Observe the guest, then QEMU's threads and memory on the host."""
    if machine.pid is None or not backend.alive(machine):
        raise RuntimeFailure(f"VM {machine.name} is not running (QEMU pid {machine.pid} gone)")
    guest, error = read_guest(agent)
    return Observed(
        guest=guest,
        guest_error=error,
        vcpu_threads=backend.vcpu_threads(machine),
        threads=tuple(observe.threads(machine.pid)),
        mappings=tuple(observe.memory_mappings(machine.pid)),
    )


def verify(machine: Machine, agent: GuestExec, backend: Backend | None = None) -> VerifyReport:
    """Compare the running VM with its plan; the report says what matched and what not."""
    if backend is None:
        backend = get_backend(machine.backend, machine.connect_uri)
    seen = gather(machine, agent, backend)
    checks = [
        *run_checks(machine.plan, seen),
        *check_shares(machine, agent),
        *check_nics(machine.boot.nics, agent),
    ]
    return VerifyReport.of(machine.name, checks)
