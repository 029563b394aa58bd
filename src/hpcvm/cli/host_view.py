"""Rich tables of a HostTopology, laid out so a person can check them against the
machine: one table per question (what is it, where is memory, how far apart, which PUs
are siblings, which caches are shared, which devices can be passed through)."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console, Group
from rich.table import Table

from hpcvm.host.model import HostTopology, NumaNode
from hpcvm.units import format_cpu_list, format_size, human_size


def render(host: HostTopology) -> Group:
    """All tables, in reading order; empty sections are left out."""
    parts: list[Table] = [summary(host), nodes(host)]
    if len(host.nodes) > 1:
        parts.append(distances(host))
    parts.append(cores(host))
    shared = caches(host)
    if shared.row_count:
        parts.append(shared)
    if host.pci:
        parts.append(pci(host))
    return Group(*parts)


def print_host(host: HostTopology, console: Console) -> None:
    console.print(render(host))


def summary(host: HostTopology) -> Table:
    table = Table(title="Host", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    online = [p for p in host.pus if p.online]
    memory_only = [n for n in host.nodes if n.kind == "memory-only"]
    rows: list[tuple[str, str]] = [
        ("source", host.source),
        ("hostname", host.hostname or "-"),
        ("CPU model", host.cpu_model or "unknown"),
        ("packages", str(len(host.packages))),
        (
            "NUMA nodes",
            f"{len(host.nodes)}" + (f" ({len(memory_only)} memory-only)" if memory_only else ""),
        ),
        ("cores", str(len({c.index for c in host.cores if _has_online(host, c.pus)}))),
        (
            "PUs online/total",
            f"{len(online)}/{len(host.pus)} (usable by VMs: {len(host.usable_pus())})",
        ),
        ("memory", human_size(sum(n.memory_bytes for n in host.nodes))),
    ]
    offline = [p.os_index for p in host.pus if not p.online]
    if offline:
        rows.append(("offline CPUs", format_cpu_list(offline)))
    disallowed = [p.os_index for p in host.pus if p.online and not p.allowed]
    if disallowed:
        rows.append(("disallowed CPUs", format_cpu_list(disallowed) + " (cgroup cpuset)"))
    barred = [n.os_index for n in host.nodes if not n.allowed]
    if barred:
        kept = [n.os_index for n in host.allowed_nodes()]
        rows.append(
            (
                "disallowed memory nodes",
                f"{format_cpu_list(barred)} (cgroup cpuset.mems): guest memory is bound only "
                f"to nodes {format_cpu_list(kept) or 'none'}",
            )
        )
    nodeless = host.nodeless_pus()
    if nodeless:
        rows.append(
            (
                "CPUs without a node",
                f"{format_cpu_list(nodeless)}: Linux lists them in no NUMA node (node offline "
                "or absent), so they have no local memory",
            )
        )
    rows += [
        ("THP", host.thp or "unknown"),
        ("KVM", _kvm(host)),
        ("IOMMU", _iommu(host)),
    ]
    if host.hugetlbfs_mounts:
        rows.append(
            (
                "hugetlbfs",
                ", ".join(f"{format_size(s)} at {m}" for s, m in host.hugetlbfs_mounts.items()),
            )
        )
    for key, value in rows:
        table.add_row(key, value)
    return table


def _has_online(host: HostTopology, pus: tuple[int, ...]) -> bool:
    return any(host.pu(p).online for p in pus)


def _kvm(host: HostTopology) -> str:
    kvm = host.kvm
    status = "usable" if kvm.usable else "not usable"
    if kvm.device is None and kvm.hw_virt is not False:
        status = "unknown"  # a description of another machine: neither fact is recorded
    device = {True: "present", False: "absent", None: "unknown"}[kvm.device]
    flags = {True: "VT-x/AMD-V", False: "no VT-x/AMD-V", None: "VT-x/AMD-V unknown"}[kvm.hw_virt]
    pvm = ", PVM" if kvm.pvm else ""
    return f"{status} (/dev/kvm {device}, {flags}{pvm}): {kvm.reason}"


def _iommu(host: HostTopology) -> str:
    if host.iommu is None:
        return "unknown (not recorded by this source)"
    if not host.iommu:
        return "off (no IOMMU groups)"
    return f"on ({len(host.iommu_groups)} groups)"


def nodes(host: HostTopology) -> Table:
    """One row per node; "available" is free memory plus inactive page cache, where the
    source says; "memory allowed" appears when cpuset.mems bars some node."""
    barred = any(not n.allowed for n in host.nodes)
    table = Table(title="NUMA nodes", title_justify="left")
    table.add_column("node", justify="right")
    table.add_column("kind", no_wrap=True)
    table.add_column("PUs", overflow="fold")
    table.add_column("memory (available)", justify="right")
    table.add_column("huge pages total/free")
    if barred:
        table.add_column("memory allowed")
    for node in host.nodes:
        kind = node.kind + (f" ({node.subtype})" if node.subtype else "")
        size = human_size(node.memory_bytes)
        if node.available_bytes is not None:
            size += f" ({human_size(node.available_bytes)})"
        row = [str(node.os_index), kind, format_cpu_list(node.pus) or "-", size, _pools(node)]
        if barred:
            row.append("yes" if node.allowed else "no (cpuset.mems)")
        table.add_row(*row)
    nodeless = host.nodeless_pus()
    if nodeless:
        row = ["none", "CPUs without a node", format_cpu_list(nodeless), "-", "-"]
        table.add_row(*row, *(["-"] if barred else []))
    return table


def _pools(node: NumaNode) -> str:
    if not node.hugepages:
        return "-"
    parts = []
    for pool in node.hugepages:
        free = "?" if pool.free is None else str(pool.free)
        parts.append(f"{format_size(pool.size_bytes)}: {pool.total}/{free}")
    return ", ".join(parts)


def distances(host: HostTopology) -> Table:
    table = Table(title="NUMA distances", title_justify="left")
    table.add_column("from\\to", justify="right", style="bold")
    for node in host.nodes:
        table.add_column(str(node.os_index), justify="right")
    for node, row in zip(host.nodes, host.distances, strict=True):
        table.add_row(str(node.os_index), *(str(v) for v in row))
    return table


def cores(host: HostTopology) -> Table:
    """Per node: how many cores, how many PUs each, and the sibling sets (compact)."""
    table = Table(title="Cores and SMT siblings", title_justify="left")
    table.add_column("node", justify="right")
    table.add_column("cores", justify="right")
    table.add_column("PUs/core", justify="right")
    table.add_column("siblings (PUs of one core)", overflow="fold")
    per_node: dict[int | None, list[tuple[int, ...]]] = defaultdict(list)
    for core in host.cores:
        if _has_online(host, core.pus):
            per_node[core.node].append(core.pus)
    for node in [*(n.os_index for n in host.nodes), None]:
        groups = per_node.get(node, [])
        if not groups:
            continue
        widths = sorted({len(g) for g in groups})
        siblings = (
            format_cpu_list([g[0] for g in groups])
            if widths == [1]
            else " ".join("(" + ",".join(map(str, g)) + ")" for g in groups)
        )
        label = "none" if node is None else str(node)
        table.add_row(label, str(len(groups)), "/".join(map(str, widths)), siblings)
    return table


def caches(host: HostTopology) -> Table:
    """Caches shared by more than one PU: one row per level, type and size, with the
    PU set of each instance (SMT-private L1/L2 show up as the core's siblings)."""
    table = Table(title="Shared caches", title_justify="left")
    table.add_column("level", justify="right")
    table.add_column("type")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_column("PUs of each instance", overflow="fold")
    grouped: dict[tuple[int, str, int], list[tuple[int, ...]]] = defaultdict(list)
    for cache in host.caches:
        if len(cache.pus) >= 2:
            grouped[(cache.level, cache.kind, cache.size_bytes)].append(cache.pus)
    for (level, kind, size), sets in sorted(grouped.items()):
        table.add_row(
            f"L{level}",
            kind,
            human_size(size),
            str(len(sets)),
            " ".join(f"({format_cpu_list(pus)})" for pus in sets),
        )
    return table


def pci(host: HostTopology) -> Table:
    """One row per device; the name (vendor:device ids first) is cut to fit."""
    table = Table(title="PCI devices (group: IOMMU group)", title_justify="left")
    for name in ("BDF", "kind", "node", "group", "driver", "OS devices", "ids and name"):
        right = name in ("node", "group")
        table.add_column(name, no_wrap=name == "BDF", justify="right" if right else "left")
    for dev in host.pci:
        ids = f"{dev.vendor_id:04x}:{dev.device_id:04x}"
        table.add_row(
            dev.bdf,
            "bridge" if dev.is_bridge else dev.kind,
            "-" if dev.numa_node is None else str(dev.numa_node),
            "-" if dev.iommu_group is None else str(dev.iommu_group),
            dev.driver or "-",
            ",".join(dev.os_devices) or "-",
            _cut(f"{ids} {dev.name}".strip(), 36),
        )
    return table


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
