"""Guest memory: its split over guest nodes, its QEMU backends, and whether the host
can hold it.

Huge pages cut TLB misses and make guest memory unswappable; binding each guest node's
memory to its host node keeps every vCPU's memory local. Both need the pages to be
there before QEMU starts, so the plan checks free pages per node and, when they are
short, says exactly what to reserve. QEMU's own memory (its heap, device state, page
tables) comes from ordinary pages of the first used node and is estimated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.host.model import HostTopology, NumaNode
from hpcvm.plan.model import Accel, AccelChoice, MemoryRegion
from hpcvm.plan.notes import Notes
from hpcvm.plan.profiles import SMALL_PAGE, page_dir_name
from hpcvm.units import GIB, MIB, format_cpu_list, format_size

OVERHEAD_BASE = 256 * MIB  # QEMU's own memory under KVM (plus 1%: qemu_overhead)
TCG_CODE_ALLOWANCE = 256 * MIB  # TCG's translated code on top (qemu_overhead)
DEFAULT_MOUNTS = {2 * MIB: "/dev/hugepages", GIB: "/dev/hugepages1G"}


class MemoryRefusal(InfeasiblePlanError):
    """A refusal that a smaller ``--memory`` would lift. Raised without a size: ``plan``
    names the largest size that plans on this host by planning it (``with_size``), so
    the size a refusal names is never refused next, whatever the page size, the free
    huge pages, the split over nodes or the memory limit make of it."""

    def __init__(
        self,
        problem: str,
        *,
        otherwise: str = "",
        nothing: str = "use a smaller --memory",
        nothing_option: str = "memory_bytes",
        cause: str | None = None,
    ) -> None:
        super().__init__(f"{problem}: {nothing}{otherwise}", cause=cause, option="memory_bytes")
        self.problem = problem
        self.otherwise = otherwise  # ", or ..." after the size
        self.nothing = nothing  # the fix when no size plans
        self.nothing_option = nothing_option

    def with_size(self, best: int) -> InfeasiblePlanError:
        """The refusal naming ``best`` (0: none plans) as the largest ``--memory``."""
        if not best:
            return InfeasiblePlanError(self.message, cause=self.cause, option=self.nothing_option)
        return InfeasiblePlanError(
            f"{self.problem}: use --memory {format_size(best)} or less{self.otherwise}",
            cause=self.cause,
            option="memory_bytes",
        )


def about(nbytes: int) -> str:
    """A size for people to read, not to type: '23.5G' for 24684092K; exact when short
    ('256M', '2G')."""
    exact = format_size(nbytes)
    if len(exact) <= 5:
        return exact
    for unit, factor in (("T", 1024 * GIB), ("G", GIB), ("M", MIB)):
        if nbytes >= factor:
            return f"{nbytes / factor:.1f}{unit}"
    return exact


def qemu_overhead(memory_bytes: int, accel: Accel = "tcg") -> int:
    """QEMU's own memory beside guest RAM under ``accel``, in whole MiB: what the
    memory checks (a node's RAM, a batch job's memory limit) count besides guest RAM.

    KVM: 256 MiB plus 1% of guest RAM (OVERHEAD_BASE). Measured on another machine
    with usable KVM (2026-11-28: the same QEMU 7.2.22 binary and libraries carried
    there, ``-machine q35 -accel kvm -cpu host``, 1 vCPU, the guest's 6.1 kernel and
    hpcvm's initramfs, 25 s after start): VmRSS 57 MiB, of it 26 MiB guest RAM touched,
    so QEMU's own some 31 MiB, for 256 and for 512 MiB guests (the guest's console was
    not kept, so how far its boot had got is not known: a lower bound for a booted
    guest, which the 256 MiB allowance is far above). Documented figure to
    compare: KubeVirt (OpenShift Virtualization 4.x, "Virtual machine memory
    overhead") reserves 218 MiB + 0.2% of guest RAM + 8 MiB per vCPU + 16 MiB per
    graphics device for its whole QEMU/KVM launcher pod; ours is above that up to 4
    vCPUs at any RAM size, below it for many vCPUs with little RAM.

    TCG adds its translation cache (TCG_CODE_ALLOWANCE): QEMU 7.2 maps a 1 GiB code
    buffer (``tb-size`` default) that fills with translated guest code, anonymous memory
    charged to QEMU's cgroup beside everything KVM's QEMU holds. Measured here (Debian
    12, QEMU 7.2.22, ``-accel tcg,thread=multi``, 1 vCPU, built-in guest, guest RAM on
    2 MiB huge pages so that VmRSS is QEMU's own; on 4K pages, VmRSS less the guest RAM
    mapping's Rss): 202 MiB for 256 and for 512 MiB of guest RAM after boot and one
    command (84 MiB of it the code buffer, 58 MiB the mapped guest kernel), the same
    for a 256 MiB guest on 4K pages; 264 and 293 MiB for 512 MiB guests after an MPI
    benchmark (136 and 162 MiB of code buffer): over the 256 MiB + 1% that KVM's figure
    allows, which let a job's ``--mem`` pass the check and the kernel kill QEMU. The
    allowance covers those with room for more translated code; a guest that runs
    enough distinct code could fill the whole buffer (1 GiB), which only a smaller
    ``tb-size`` would bound. tests/integration/test_agent_busy.py measures a booted
    guest against it."""
    base = OVERHEAD_BASE + -(-memory_bytes // 100 // MIB) * MIB
    return base + (TCG_CODE_ALLOWANCE if accel == "tcg" else 0)


def accel_in_use(host: HostTopology, requested: AccelChoice = "auto") -> Accel:
    """The accelerator a plan of this host will use (as plan/cpu.py chooses it: TCG when
    asked for or when KVM is not usable; KVM when usable, or asked for where a host
    description cannot tell), for the memory checks."""
    if requested == "tcg":
        return "tcg"
    if host.kvm.usable or requested == "kvm":
        return "kvm"
    return "tcg"


def split_unit(total: int, page: int) -> int:
    """The unit guest memory is split in: whole MiB for small pages when the total is
    whole MiB (OpenStack's flavors, libvirt's and people's tables count guest node
    memory in MiB: 1G over 3 guest nodes is 342M + 341M + 341M, not 349525.33K each),
    else the page."""
    return MIB if page < MIB and total % MIB == 0 else page


def split_parts(total: int, page: int, weights: Sequence[int]) -> list[int]:
    """``total`` bytes in proportion to ``weights``, in units of ``split_unit``
    (largest remainder: each part within one unit of its exact share, summing to
    total); a part may be 0."""
    unit = split_unit(total, page)
    return [p * unit for p in _largest_remainder(total // unit, weights)]


def split_memory(total: int, page: int, weights: Sequence[int]) -> list[int]:
    """``split_parts``, every part at least one unit. Raises UsageError naming the
    smallest size that gives every part one."""
    parts = split_parts(total, page, weights)
    if min(parts) >= 1:
        return parts
    unit = split_unit(total, page)
    units = total // unit
    while min(_largest_remainder(units, weights)) < 1:
        units += 1
    raise UsageError(
        f"--memory {format_size(total)} cannot be split in {format_size(unit)} parts over "
        f"{len(weights)} guest nodes in proportion to their vCPUs "
        f"({', '.join(map(str, weights))}): use --memory {format_size(units * unit)} or more",
        option="memory_bytes",
    )


def _largest_remainder(pages: int, weights: Sequence[int]) -> list[int]:
    whole = sum(weights)
    exact = [pages * w for w in weights]  # each share is exact[i] / whole pages
    parts = [e // whole for e in exact]
    left = pages - sum(parts)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] % whole), i))
    for i in order[:left]:
        parts[i] += 1
    return parts


def mem_path(host: HostTopology, page: int) -> str:
    """Where hugetlbfs of this page size is mounted, or where the runtime mounts it."""
    return host.hugetlbfs_mounts.get(page) or DEFAULT_MOUNTS[page]


@dataclass(frozen=True)
class MemoryPlan:
    regions: tuple[MemoryRegion, ...]
    hugepages_needed: dict[int, int]


def flat_memory(
    host: HostTopology,
    total: int,
    page: int,
    first_node: int | None,
    notes: Notes,
    accel: Accel | None = None,
) -> MemoryPlan:
    """One unbound region: anonymous memory, or hugetlbfs for the hugepages profile.
    ``accel``: the plan's (None: the one this host would use, accel_in_use)."""
    accel = accel or accel_in_use(host)
    overhead = qemu_overhead(total, accel)
    normal = list(host.allowed_nodes())
    limit = sum(_node_limit(n, page) for n in normal)
    check_host_total(host, total, overhead, page, accel)
    if total + overhead > limit:
        raise _too_big_flat(total, overhead, limit, normal, page)
    if page == SMALL_PAGE:
        notes.decide(
            "memory",
            f"memory: one {format_size(total)} region of anonymous memory "
            "(memory-backend-ram), not bound to any host node: the kernel places it",
        )
        region = MemoryRegion(
            id="ram", size_bytes=total, guest_node=None, backend="ram", page_size_bytes=page
        )
        return MemoryPlan(regions=(region,), hugepages_needed={})
    pages = total // page
    _check_free_flat(host, normal, pages, page, notes)
    path = mem_path(host, page)
    needed = {first_node: pages} if first_node is not None else {}
    notes.decide(
        "memory",
        f"memory: one {format_size(total)} region on {format_size(page)} huge pages "
        f"(hugetlbfs at {path}, {pages} pages), preallocated, not bound to any host node",
    )
    if first_node is not None:
        notes.decide(
            "hugepages",
            f"the {pages} pages are counted against host node {first_node}, the first vCPUs' "
            "node (or the nearest one cpuset.mems allows); unbound, the kernel may take them "
            "from any allowed node (free pages were checked over the allowed nodes)",
        )
    region = MemoryRegion(
        id="ram",
        size_bytes=total,
        guest_node=None,
        backend="file",
        page_size_bytes=page,
        mem_path=path,
        prealloc=True,
    )
    return MemoryPlan(regions=(region,), hugepages_needed=needed)


def numa_memory(
    host: HostTopology,
    total: int,
    page: int,
    guest_nodes: Sequence[tuple[int, int]],
    notes: Notes,
    accel: Accel | None = None,
) -> tuple[MemoryPlan, list[int]]:
    """One region per guest node, bound to its host node. ``guest_nodes`` is a list of
    (host node, vCPU count); ``accel`` as in flat_memory. Returns the plan and each
    guest node's size."""
    accel = accel or accel_in_use(host)
    overhead = qemu_overhead(total, accel)
    nodes = {n.os_index: n for n in host.nodes}
    first = min(h for h, _ in guest_nodes)
    check_host_total(host, total, overhead, page, accel)
    sizes = split_memory(total, page, [v for _, v in guest_nodes])
    per_host = _per_host(guest_nodes, sizes)
    for h, guest_bytes in per_host.items():
        oh = overhead if h == first else 0
        if guest_bytes + oh > _node_limit(nodes[h], page):
            raise _too_big_node(nodes[h], guest_bytes, oh, page)
    needed = {h: b // page for h, b in per_host.items()} if page > SMALL_PAGE else {}
    if needed:
        _check_free_bound(host, needed, page, notes)
    notes.decide(
        "memory",
        f"QEMU's own memory estimated at {format_size(overhead)} ({_overhead_terms(accel)}), "
        f"from ordinary pages of host node {first}",
    )
    regions = _bound_regions(host, guest_nodes, sizes, page, notes)
    return MemoryPlan(regions=regions, hugepages_needed=needed), sizes


def _bound_regions(
    host: HostTopology,
    guest_nodes: Sequence[tuple[int, int]],
    sizes: Sequence[int],
    page: int,
    notes: Notes,
) -> tuple[MemoryRegion, ...]:
    huge = page > SMALL_PAGE
    path = mem_path(host, page) if huge else None
    regions = []
    for g, ((host_node, _), size) in enumerate(zip(guest_nodes, sizes, strict=True)):
        regions.append(
            MemoryRegion(
                id=f"mem{g}",
                size_bytes=size,
                guest_node=g,
                backend="file" if huge else "ram",
                page_size_bytes=page,
                mem_path=path,
                host_nodes=(host_node,),
                policy="bind",
                prealloc=True,
            )
        )
    kind = (
        f"{format_size(page)} huge pages (hugetlbfs at {path})"
        if huge
        else "ordinary 4K pages (memory-backend-ram)"
    )
    parts = "; ".join(
        f"guest node {g} -> host node {h}: {format_size(s)}"
        + (f" ({s // page} pages)" if huge else "")
        for g, ((h, _), s) in enumerate(zip(guest_nodes, sizes, strict=True))
    )
    notes.decide(
        "memory",
        f"memory on {kind}, split in proportion to vCPUs, bound (policy bind) and "
        f"preallocated per node: {parts}",
    )
    return tuple(regions)


def _per_host(guest_nodes: Sequence[tuple[int, int]], sizes: Sequence[int]) -> dict[int, int]:
    load: dict[int, int] = {}
    for (h, _), size in zip(guest_nodes, sizes, strict=True):
        load[h] = load.get(h, 0) + size
    return load


def _pools_bytes(node: NumaNode, *, except_size: int | None = None) -> int:
    return sum(p.total * p.size_bytes for p in node.hugepages if p.size_bytes != except_size)


def ordinary_bytes(node: NumaNode) -> int:
    """Ordinary (4K) memory a node can give now: memory outside every pool, and no more
    than the kernel reports available (free + inactive page cache) where it says."""
    outside = node.memory_bytes - _pools_bytes(node)
    if node.available_bytes is None:
        return outside
    return min(outside, node.available_bytes)


def _node_limit(node: NumaNode, page: int) -> int:
    """What one node could give a guest: ordinary pages for 4K; for huge pages, memory
    outside the pools of other sizes (the pool of this size can grow)."""
    if page == SMALL_PAGE:
        return ordinary_bytes(node)
    return node.memory_bytes - _pools_bytes(node, except_size=page)


def memory_fits(
    host: HostTopology,
    total: int,
    page: int,
    loads: Sequence[tuple[int, int]],
    strict: bool,
    accel: Accel | None = None,
) -> bool:
    """Whether ``total`` bytes split over ``loads`` ((memory node, vCPUs) per guest
    node, in proportion to vCPUs) fit their nodes, with QEMU's overhead on the lowest
    node. strict: huge pages must be free now; else the pools may grow (the plan then
    says what to reserve)."""
    parts = split_parts(total, page, [v for _, v in loads])
    per_node: dict[int, int] = {}
    for (node, _), part in zip(loads, parts, strict=True):
        per_node[node] = per_node.get(node, 0) + part
    first = min(per_node)
    overhead = qemu_overhead(total, accel or accel_in_use(host))
    nodes = {n.os_index: n for n in host.nodes}
    for node, guest in per_node.items():
        oh = overhead if node == first else 0
        if not _holds(nodes[node], guest, oh, page, strict=strict):
            return False
    return True


def _holds(node: NumaNode, guest: int, overhead: int, page: int, *, strict: bool) -> bool:
    if page == SMALL_PAGE or not strict:
        return guest + overhead <= _node_limit(node, page)
    _total, free, _known = _free_pages(node, page)
    return guest <= free * page and overhead <= ordinary_bytes(node)


def largest_fitting(fits: Callable[[int], bool], total: int, page: int) -> int:
    """The largest multiple of ``page`` (and of 1 MiB) up to ``total`` that fits."""
    step = max(page, MIB)
    lo, hi = 0, total // step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * step):
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def check_host_total(
    host: HostTopology, total: int, overhead: int, page: int, accel: Accel | None = None
) -> None:
    """Refuse memory beyond the allowed nodes' RAM (``plan`` names the largest size
    that plans: MemoryRefusal), or beyond this process's memory limit."""
    have = sum(n.memory_bytes for n in host.allowed_nodes())
    barred = [n.os_index for n in host.nodes if not n.allowed and n.kind == "normal"]
    kept = format_cpu_list([n.os_index for n in host.allowed_nodes()])
    where = f" on the nodes cpuset.mems allows ({kept})" if barred else ""
    if total + overhead > have:
        raise MemoryRefusal(
            f"--memory {format_size(total)} plus about {about(overhead)} of QEMU overhead "
            f"is more than this host's {about(have)} of RAM{where}",
            nothing=_nothing_fits(page, "the host is too small"),
        )
    check_memory_limit(host, total, page, accel)


def _nothing_fits(page: int, otherwise: str) -> str:
    """The fix when no --memory plans: on huge pages, it is the free pages that lack."""
    if page == SMALL_PAGE:
        return otherwise
    return (
        f"no --memory plans with the {format_size(page)} huge pages free now: reserve more "
        "(the plan of a size the RAM holds says how many and where)"
    )


def check_memory_limit(
    host: HostTopology, total: int, page: int, accel: Accel | None = None
) -> None:
    """Refuse, before anything starts, a VM that this process's cgroup would OOM-kill
    midway: QEMU's own memory, and guest RAM on 4K pages, are charged to it (a batch
    job's memory request); guest RAM on huge pages is not (no hugetlb limit)."""
    limit = host.memory_limit
    charged = limit_charge(total, page, accel or accel_in_use(host))
    if limit is None or charged <= limit:
        return
    problem = (
        f"--memory {format_size(total)} would charge about {about(charged)} to this "
        f"process's memory limit of {about(limit)} (its cgroup: a batch job's memory) "
        "and QEMU would be killed midway"
    )
    batch = "ask the batch system for more memory (Slurm: #SBATCH --mem=SIZE)"
    if page == SMALL_PAGE:
        raise MemoryRefusal(
            problem,
            otherwise=f", or {batch}, or put guest RAM on huge pages (which it does not count)",
            nothing=batch + ", or put guest RAM on huge pages (which it does not count)",
            cause="memory-limit",
        )
    raise InfeasiblePlanError(f"{problem}: {batch}", cause="memory-limit", option="memory_bytes")


def limit_charge(total: int, page: int, accel: Accel = "tcg") -> int:
    """What a VM of ``total`` guest RAM on ``page``-sized pages charges to its
    process's memory limit: QEMU's own memory under ``accel`` (TCG's, the larger, when
    not said), and guest RAM on 4K pages (huge pages are not charged: no hugetlb
    limit)."""
    return qemu_overhead(total, accel) + (total if page == SMALL_PAGE else 0)


def _overhead_terms(accel: Accel) -> str:
    """How qemu_overhead counted, for the plan's notes."""
    tcg = f" + {format_size(TCG_CODE_ALLOWANCE)} of TCG's translated code" if accel == "tcg" else ""
    return f"{format_size(OVERHEAD_BASE)} + 1% of guest RAM{tcg}"


def check_held_together(host: HostTopology, vms: Sequence[tuple[str, int]]) -> None:
    """Refuse, before any starts, VMs that are each within this process's memory limit
    (a batch job's memory) but held at once are not (``bench`` keeps every
    environment's VM up, paused, while another is measured): the kernel would kill the
    last QEMU to grow, midway. ``vms``: each VM's name and :func:`limit_charge`."""
    limit = host.memory_limit
    charged = sum(c for _name, c in vms)
    if limit is None or len(vms) < 2 or charged <= limit:
        return
    each = ", ".join(f"{name} {format_size(c)}" for name, c in vms)
    raise InfeasiblePlanError(
        f"the VMs held at once ({each}) would charge about {format_size(charged)} to this "
        f"process's memory limit of {format_size(limit)} (its cgroup: a batch job's "
        "memory), and the kernel would kill one midway: ask the batch system for more "
        "memory (Slurm: #SBATCH --mem=SIZE), or run fewer VM environments with guest RAM "
        "on 4K pages, or a smaller --vm-memory",
        cause="memory-limit",
        option="memory_bytes",
    )


def _too_big_flat(
    total: int, overhead: int, limit: int, normal: Sequence[NumaNode], page: int
) -> MemoryRefusal:
    pools = sum(_pools_bytes(n, except_size=None if page == SMALL_PAGE else page) for n in normal)
    return MemoryRefusal(
        f"--memory {format_size(total)} plus about {about(overhead)} of QEMU overhead "
        f"does not fit the {about(max(limit, 0))} of memory left outside the host's "
        f"{about(pools)} of huge page pools",
        otherwise=", or shrink the pools",
        nothing=_nothing_fits(page, "shrink the pools"),
    )


def _too_big_node(node: NumaNode, guest_bytes: int, overhead: int, page: int) -> MemoryRefusal:
    pools = _pools_bytes(node, except_size=None if page == SMALL_PAGE else page)
    pools_text = f", {about(pools)} of it held in huge page pools" if pools else ""
    over = f" and about {about(overhead)} of QEMU overhead" if overhead else ""
    return MemoryRefusal(
        f"host node {node.os_index} has {about(node.memory_bytes)} of RAM{pools_text}; "
        f"the plan puts {format_size(guest_bytes)} of guest memory{over} there",
        otherwise=", or spread the vCPUs over more nodes",
        nothing=_nothing_fits(page, "use a smaller --memory"),
    )


def _free_pages(node: NumaNode, page: int) -> tuple[int, int, bool]:
    """(total, free, known) of the node's pool of this size; no pool counts as 0/0."""
    pool = node.pool(page)
    if pool is None:
        return 0, 0, True
    if pool.free is None:
        return pool.total, pool.total, False
    return pool.total, pool.free, True


def _check_free_bound(host: HostTopology, needed: dict[int, int], page: int, notes: Notes) -> None:
    nodes = {n.os_index: n for n in host.nodes}
    short: list[tuple[str, str]] = []
    seen: list[str] = []
    for h, want in sorted(needed.items()):
        total, free, known = _free_pages(nodes[h], page)
        if not known:
            _warn_unknown_free(notes, page)
        seen.append(f"host node {h}: {want} needed, {free} {'free' if known else 'reserved'}")
        if free < want:
            path = f"/sys/devices/system/node/node{h}/hugepages/{page_dir_name(page)}/nr_hugepages"
            short.append(_shortfall_text(f"host node {h}", want, free, total, known, page, path))
    if short:
        raise _shortfall(short, page)
    notes.decide("hugepages", f"{format_size(page)} huge pages per node: " + "; ".join(seen))


def _check_free_flat(
    host: HostTopology, normal: Sequence[NumaNode], want: int, page: int, notes: Notes
) -> None:
    total = free = 0
    known = True
    for node in normal:
        t, f, k = _free_pages(node, page)
        total, free, known = total + t, free + f, known and k
    if not known:
        _warn_unknown_free(notes, page)
    if free < want:
        path = f"/sys/kernel/mm/hugepages/{page_dir_name(page)}/nr_hugepages"
        raise _shortfall([_shortfall_text("the host", want, free, total, known, page, path)], page)
    notes.decide(
        "hugepages",
        f"{format_size(page)} huge pages: the plan takes {want}, the host has {free} "
        f"{'free' if known else 'reserved'} over all nodes",
    )


def _shortfall_text(
    where: str, want: int, free: int, total: int, known: bool, page: int, path: str
) -> tuple[str, str]:
    """What lacks where, and the reservation that gives it."""
    size = format_size(page)
    have = f"{free} are free" if known else f"{total} are reserved (free count unknown)"
    return (
        f"not enough {'free ' if known else ''}{size} huge pages on {where}: the plan needs "
        f"{want} ({format_size(want * page)}), {have}",
        f"reserve {want - free} more: echo {total + want - free} > {path}",
    )


def _shortfall(short: Sequence[tuple[str, str]], page: int) -> InfeasiblePlanError:
    """Too few free huge pages: what lacks where, and the reservations that make room.
    (``plan`` names no smaller --memory here: the size is what the user wants.)"""
    text = "; ".join(f"{lack}; {reserve}" for lack, reserve in short)
    return InfeasiblePlanError(text + _boot_hint(page), option="memory_bytes")


def _boot_hint(page: int) -> str:
    if page >= GIB:
        return " (1G pages are best reserved at boot: hugepagesz=1G hugepages=N)"
    return ""


def _warn_unknown_free(notes: Notes, page: int) -> None:
    notes.warn(
        f"free {format_size(page)} huge pages could not be checked (the host description "
        "gives pool totals only): the plan was checked against the totals"
    )
