"""discover(): one HostTopology from this host, a sysfs snapshot or an hwloc XML file.

hwloc gives the topology (hwloc.py); what it lacks is read from the same root
(sysfs.py, kvm.py); this module checks the inputs and joins the two, adding a warning
for everything a person planning a VM should know (offline CPUs, cgroup limits...).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hpcvm.errors import TopologyError, UsageError
from hpcvm.host import hwloc, sysfs
from hpcvm.host.kvm import live_kvm, snapshot_kvm
from hpcvm.host.model import (
    PU,
    Cache,
    Core,
    HostTopology,
    HugePagePool,
    KvmInfo,
    NumaNode,
    Package,
    PciDevice,
)
from hpcvm.host.pci import classify, local_node
from hpcvm.units import format_cpu_list, human_size

LIVE_ROOT = Path("/")
LOCAL_DISTANCE = 10
REMOTE_DISTANCE = 20
LAZY_MEMORY_RATIO = 0.99  # node totals below this share of MemTotal: memory not initialised yet
_SNAPSHOT_HINT = "give the root of an hwloc-gather-topology snapshot"


@dataclass(frozen=True)
class _Source:
    """Where the topology comes from and which root (if any) holds the rest."""

    label: str  # HostTopology.source
    root: Path | None  # file-system root for sysfs/proc reads; None for XML/synthetic
    live: bool


def discover(*, sysfs_root: Path | None = None, xml: Path | None = None) -> HostTopology:
    """Read a host: this machine (no argument), a sysfs snapshot root, or an hwloc XML
    export. Raises TopologyError (one line, naming the path and the fix) when the input
    cannot be read, UsageError when both sources are given."""
    if sysfs_root is not None and xml is not None:
        raise UsageError("give either --sysfs-root or --topology, not both")
    if sysfs_root is not None:
        root = _check_sysfs_root(sysfs_root)
        text = hwloc.export_xml(fsroot=root)
        return _build(text, _Source(f"sysfs:{root}", root, live=False))
    if xml is not None:
        path = _check_xml(xml)
        text = hwloc.export_xml(xml=path)
        return _build(text, _Source(f"xml:{path}", None, live=False))
    return _build(hwloc.export_xml(), _Source("live", LIVE_ROOT, live=True))


def synthetic(description: str) -> HostTopology:
    """A HostTopology from an hwloc synthetic description, e.g.
    ``"pack:2 numa:2(memory=64GiB) core:8 pu:2"``: for property tests and benchmarks of
    the planner on machines of any shape."""
    text = hwloc.export_xml(synthetic=description)
    return _build(text, _Source(f"synthetic:{description}", None, live=False))


# --------------------------------------------------------------------------- inputs


def _check_sysfs_root(path: Path) -> Path:
    kind = _kind(path)
    if kind != "dir":
        what = {"missing": "no such directory", "file": "not a directory"}.get(kind, kind)
        what = "not a directory" if what == "not a regular file" else what
        raise TopologyError(f"--sysfs-root {path}: {what}; {_SNAPSHOT_HINT}")
    if _kind(path / "sys" / "devices" / "system" / "cpu") != "dir":
        inner = [
            p for p in _subdirs(path) if _kind(p / "sys" / "devices" / "system" / "cpu") == "dir"
        ]
        hint = f"did you mean {inner[0]}?" if len(inner) == 1 else _SNAPSHOT_HINT
        raise TopologyError(f"--sysfs-root {path}: no sys/devices/system/cpu under it; {hint}")
    return path.resolve()


def _kind(path: Path) -> str:
    """ "dir", "file", "missing", "not a directory" or "not a regular file" (something
    else is there), or why it cannot be looked at ("cannot be reached (Permission
    denied)"): ``Path.is_dir`` raises on a path this user may not search (Python 3.11)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return "missing"
        return f"cannot be reached ({os.strerror(exc.errno or errno.EIO)})"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "not a regular file"


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if _kind(p) == "dir")
    except OSError:
        return []


def _check_xml(path: Path) -> Path:
    hint = "give an hwloc XML export (lstopo-no-graphics --of xml > FILE.xml)"
    kind = _kind(path)
    if kind == "missing":
        raise TopologyError(f"--topology {path}: no such file; {hint}")
    if kind == "dir":
        raise TopologyError(f"--topology {path}: not a regular file; {hint}")
    if kind != "file":
        raise TopologyError(f"--topology {path}: {kind}; {hint}")
    if not os.access(path, os.R_OK):
        raise TopologyError(f"--topology {path}: not readable; check its permissions")
    if path.stat().st_size == 0:
        raise TopologyError(f"--topology {path}: the file is empty; {hint}")
    return path.resolve()


# --------------------------------------------------------------------------- assembly


@dataclass
class _Draft:
    """Pieces collected while assembling, before they become frozen models."""

    warnings: list[str] = field(default_factory=list)


def _build(text: str, source: _Source) -> HostTopology:
    view = hwloc.parse(text, what=_what(source))
    if source.live:
        view.allowed_cpuset = _within_affinity(view.allowed_cpuset, view.pus)
    draft = _Draft()
    nodes_hw = sorted(view.nodes, key=lambda n: n.os_index)
    if not nodes_hw:
        raise TopologyError(f"{_what(source)}: hwloc found no NUMA node in it")
    memory_only = {n.os_index for n in nodes_hw if _is_memory_only(n)}
    normal = [n for n in nodes_hw if n.os_index not in memory_only] or nodes_hw
    pu_node = _pu_nodes(view, normal, nodes_hw)
    offline = sorted(view.complete_cpuset - set(view.pus))
    offline_node = _place_offline(offline, source, normal, draft)
    cores, pus = _cores_and_pus(view, pu_node, offline_node)

    cpu = sysfs.cpuinfo(source.root) if source.root is not None else None
    single = len(nodes_hw) == 1
    allowed = view.allowed_nodeset
    nodes = [
        _node(n, memory_only, pus, source, draft, single_node=single, allowed_nodes=allowed)
        for n in nodes_hw
    ]
    order = [n.os_index for n in nodes]
    groups = _iommu_groups(source)
    pci = _pci(view, source, order, memory_only, groups)
    _warn_cpus(pus, view, order, draft)
    nodes = _what_the_kernel_gives(nodes, source, draft)
    cpu_model = next((p.cpu_model for p in view.packages if p.cpu_model), "") or (
        cpu.model if cpu else ""
    )
    return HostTopology(
        source=source.label,
        hostname=_hostname(view, source),
        cpu_model=cpu_model,
        cpu_flags=cpu.flags if cpu else frozenset(),
        packages=tuple(_packages(view, order)),
        nodes=tuple(nodes),
        cores=tuple(cores),
        pus=tuple(pus),
        caches=tuple(_caches(view)),
        distances=_distances(view, order, source, draft),
        thp=sysfs.thp_mode(source.root) if source.root is not None else None,
        nohz_full=_nohz_full(source),
        kvm=_kvm(source, cpu),
        iommu=_iommu_on(groups, source),
        iommu_groups=groups or {},
        hugetlbfs_mounts=sysfs.hugetlbfs_mounts(LIVE_ROOT) if source.live else {},
        memory_limit=sysfs.memory_limit(LIVE_ROOT) if source.live else None,
        pci=tuple(pci),
        warnings=tuple(draft.warnings),
    )


def _within_affinity(allowed: frozenset[int] | None, pus: Iterable[int]) -> frozenset[int]:
    """What this process may run on: the cgroup's cpuset (hwloc's allowed set) and its
    CPU affinity (taskset, a batch system's task binding such as Slurm's task/affinity,
    or hpcvm's own local batch system) together. hwloc reads only the former."""
    mine = frozenset(os.sched_getaffinity(0))
    return (frozenset(pus) if allowed is None else allowed) & mine


def _cores_and_pus(
    view: hwloc.HwlocView, pu_node: dict[int, int | None], offline_node: dict[int, int | None]
) -> tuple[list[Core], list[PU]]:
    """Cores ordered by their first PU; each offline CPU (unknown to hwloc's tree)
    becomes a core of its own, so every PU still sits in exactly one core."""
    allowed = view.allowed_cpuset

    cores_hw = sorted(view.cores, key=lambda c: c.pus[0] if c.pus else -1)
    cores: list[Core] = []
    pus: list[PU] = []
    for hw_core in cores_hw:
        if not hw_core.pus:
            continue
        index = len(cores)
        node = pu_node[hw_core.pus[0]]
        cores.append(
            Core(
                index=index,
                os_index=hw_core.os_index,
                package=hw_core.package,
                node=node,
                pus=hw_core.pus,
            )
        )
        for pu in hw_core.pus:
            pus.append(
                PU(
                    os_index=pu,
                    core=index,
                    package=hw_core.package,
                    node=pu_node[pu],
                    online=True,
                    allowed=allowed is None or pu in allowed,
                )
            )
    for pu in sorted(offline_node):
        index = len(cores)
        node = offline_node[pu]
        cores.append(Core(index=index, os_index=None, package=-1, node=node, pus=(pu,)))
        # An offline CPU is in no cpuset hwloc reports; "allowed" stays True so that
        # only the online CPUs a cgroup bars are reported as disallowed.
        pus.append(PU(os_index=pu, core=index, package=-1, node=node, online=False))
    pus.sort(key=lambda p: p.os_index)
    return cores, pus


def _what(source: _Source) -> str:
    return "this host" if source.live else source.label


def _is_memory_only(node: hwloc.HwNode) -> bool:
    """No PUs of its own: an empty cpuset, or a hwloc subtype such as GPUMemory or
    MCDRAM (hwloc attaches such nodes beside the CPU's own node, sharing its cpuset)."""
    return not node.cpuset or (node.subtype is not None and node.subtype.upper() != "DRAM")


def _pu_nodes(
    view: hwloc.HwlocView, normal: list[hwloc.HwNode], all_nodes: list[hwloc.HwNode]
) -> dict[int, int | None]:
    """Each online PU's node: the lowest normal node whose cpuset holds it (else a
    memory-only one). None when no node holds it: its node is offline or absent, and
    hwloc leaves it outside every node, as Linux leaves it out of every node cpulist."""
    out: dict[int, int | None] = {}
    for pu in view.pus:
        out[pu] = None
        for candidates in (normal, all_nodes):
            hit = next((n.os_index for n in candidates if pu in n.cpuset), None)
            if hit is not None:
                out[pu] = hit
                break
    return out


def _place_offline(
    offline: list[int], source: _Source, normal: list[hwloc.HwNode], draft: _Draft
) -> dict[int, int | None]:
    """hwloc does not place offline CPUs; the kernel's node cpulists (same root) do.
    Without them an offline CPU is on the only node, or on no known node."""
    placed: dict[int, int | None] = {}
    if source.root is not None:
        for node in normal:
            for cpu in sysfs.node_cpus(source.root, node.os_index) or []:
                if cpu in offline:
                    placed.setdefault(cpu, node.os_index)
    unplaced = [cpu for cpu in offline if cpu not in placed]
    single = normal[0].os_index if len(normal) == 1 else None
    for cpu in unplaced:
        placed[cpu] = single
    if unplaced and single is None:
        draft.warnings.append(
            f"NUMA node of offline CPUs {format_cpu_list(unplaced)} is unknown: they are "
            "shown without a node"
        )
    return placed


def _node(
    hw: hwloc.HwNode,
    memory_only: set[int],
    pus: list[PU],
    source: _Source,
    draft: _Draft,
    *,
    single_node: bool,
    allowed_nodes: frozenset[int] | None,
) -> NumaNode:
    kind = "memory-only" if hw.os_index in memory_only else "normal"
    allowed = allowed_nodes is None or hw.os_index in allowed_nodes
    if hw.memory_bytes == 0:
        draft.warnings.append(
            f"NUMA node {hw.os_index} has no memory: guest memory cannot be bound to it"
        )
    return NumaNode(
        os_index=hw.os_index,
        memory_bytes=hw.memory_bytes,
        pus=tuple(p.os_index for p in pus if p.node == hw.os_index),
        hugepages=tuple(_pools(hw, source, single_node=single_node)),
        kind=kind,
        subtype=hw.subtype,
        allowed=allowed,
        available_bytes=_available(source, hw.os_index),
    )


def _available(source: _Source, node: int) -> int | None:
    """MemFree + Inactive(file) of the node's meminfo: free now, plus page cache the
    kernel drops first. None when the root has no node meminfo (or no root)."""
    if source.root is None:
        return None
    info = sysfs.node_meminfo(source.root, node)
    if "MemFree" not in info:
        return None
    return info["MemFree"] + info.get("Inactive(file)", 0)


def _pools(hw: hwloc.HwNode, source: _Source, *, single_node: bool) -> list[HugePagePool]:
    """Per-node huge page pools: totals and free counts from the root's sysfs when it
    has them, else totals from hwloc's page_type (free unknown)."""
    if source.root is not None:
        pools = sysfs.node_hugepages(source.root, hw.os_index)
        if not pools and single_node:
            pools = sysfs.global_hugepages(source.root)
        if pools:
            return [
                HugePagePool(size_bytes=p.size_bytes, total=p.total, free=p.free) for p in pools
            ]
    huge = hw.page_types[1:]  # the smallest page_type is the base page size
    return [HugePagePool(size_bytes=size, total=count, free=None) for size, count in huge]


def _packages(view: hwloc.HwlocView, order: list[int]) -> list[Package]:
    known = set(order)
    packages = [
        Package(os_index=p.os_index, nodes=tuple(sorted(p.nodeset & known)), cpu_model=p.cpu_model)
        for p in view.packages
    ]
    return sorted(packages, key=lambda p: p.os_index)


def _caches(view: hwloc.HwlocView) -> list[Cache]:
    caches = [
        Cache(level=c.level, kind=c.kind, size_bytes=c.size_bytes, pus=c.pus)
        for c in view.caches
        if c.pus
    ]
    return sorted(caches, key=lambda c: (c.level, c.kind, c.pus[0]))


def _distances(
    view: hwloc.HwlocView, order: list[int], source: _Source, draft: _Draft
) -> tuple[tuple[int, ...], ...]:
    """hwloc's NUMA latency matrix in the order of ``order``; else the kernel's from
    the same root (hwloc drops it on some machines, e.g. KNL); else 10 local / 20
    remote with a warning."""
    dist = view.distances
    if dist is not None and set(order) <= set(dist.indexes):
        pos = {os_index: i for i, os_index in enumerate(dist.indexes)}
        return tuple(tuple(dist.values[pos[a]][pos[b]] for b in order) for a in order)
    if source.root is not None and len(order) > 1:
        rows = sysfs.node_distances(source.root, order)
        if rows is not None:
            return tuple(tuple(row) for row in rows)
    if len(order) > 1:
        draft.warnings.append(
            "no NUMA distance matrix in the source: assuming "
            f"{LOCAL_DISTANCE} local / {REMOTE_DISTANCE} remote"
        )
    return tuple(tuple(LOCAL_DISTANCE if a == b else REMOTE_DISTANCE for b in order) for a in order)


def _warn_cpus(pus: list[PU], view: hwloc.HwlocView, order: list[int], draft: _Draft) -> None:
    offline = [p.os_index for p in pus if not p.online]
    if offline:
        draft.warnings.append(
            f"CPUs {format_cpu_list(offline)} are offline: plans will not use them"
        )
    disallowed = [p.os_index for p in pus if not p.allowed]
    if disallowed:
        draft.warnings.append(
            f"CPUs {format_cpu_list(disallowed)} are outside this process's cpuset (cgroup) "
            "or CPU affinity: plans will not use them"
        )
    nodeless = [p.os_index for p in pus if p.node is None and p.online]
    if nodeless:
        draft.warnings.append(
            f"CPUs {format_cpu_list(nodeless)} belong to no NUMA node (their node is offline "
            "or absent): they have no local memory, so plans use them only after every CPU "
            "with one, and bind their memory to the nearest allowed node"
        )
    if view.allowed_nodeset is not None:
        barred = sorted(set(order) - view.allowed_nodeset)
        if barred:
            kept = sorted(set(order) & view.allowed_nodeset)
            local = [p.os_index for p in pus if p.node in barred and p.online and p.allowed]
            text = (
                f"NUMA nodes {format_cpu_list(barred)} are outside this process's memory set "
                f"(cgroup cpuset.mems): plans bind guest memory only to nodes "
                f"{format_cpu_list(kept) or 'none'}"
            )
            if local:
                text += (
                    f"; usable CPUs {format_cpu_list(local)} are local to a barred node, so "
                    "plans use them only after the others, with memory on the nearest "
                    "allowed node"
                )
            draft.warnings.append(text)


def _what_the_kernel_gives(nodes: list[NumaNode], source: _Source, draft: _Draft) -> list[NumaNode]:
    """Node memory as the kernel can give it, which the node files can understate.

    Under ``deferred_init=lazy`` (this project's machine) a node's meminfo counts only
    the memory initialised so far, while /proc/meminfo's MemTotal counts it all and the
    kernel initialises the rest when asked. The difference is added to the nodes that
    hold it (one node: all of it; several: in proportion to their zones' uninitialised
    pages in /proc/zoneinfo), to their size and to what they can give; where no file
    says which node holds it, a warning says the sizes are what the kernel has so far.
    A host of one node can give what the kernel estimates itself: MemAvailable (free
    and reclaimable memory, uninitialised memory included, less its reserves).
    """
    if source.root is None:
        return nodes
    info = sysfs.meminfo(source.root)
    total = info.get("MemTotal")
    in_nodes = sum(n.memory_bytes for n in nodes)
    if total and in_nodes < LAZY_MEMORY_RATIO * total:
        shares = _lazy_shares(nodes, total - in_nodes, sysfs.uninitialised_pages(source.root))
        nodes = [_grown(n, shares.get(n.os_index, 0)) for n in nodes]
        text = (
            f"NUMA nodes report {human_size(in_nodes)} but MemTotal is {human_size(total)}: "
            "the kernel initialises memory lazily"
        )
        if shares:
            where = ", ".join(f"node {k}: {human_size(v)}" for k, v in sorted(shares.items()))
            text += (
                f"; the {human_size(total - in_nodes)} not initialised yet, which it "
                f"initialises when asked, is counted in node sizes and available memory "
                f"({where})"
            )
        else:
            text += "; node sizes shown are what it has so far"
        draft.warnings.append(text)
    available = info.get("MemAvailable")
    if len(nodes) == 1 and available is not None:
        nodes = [nodes[0].model_copy(update={"available_bytes": available})]
    return nodes


def _lazy_shares(nodes: list[NumaNode], missing: int, gaps: dict[int, int]) -> dict[int, int]:
    """``missing`` bytes split over the nodes that hold them (see the caller)."""
    if len(nodes) == 1:
        return {nodes[0].os_index: missing}
    weights = {n.os_index: gaps.get(n.os_index, 0) for n in nodes}
    whole = sum(weights.values())
    if whole <= 0:
        return {}
    return {k: missing * w // whole for k, w in weights.items() if w}


def _grown(node: NumaNode, extra: int) -> NumaNode:
    if not extra:
        return node
    available = None if node.available_bytes is None else node.available_bytes + extra
    return node.model_copy(
        update={"memory_bytes": node.memory_bytes + extra, "available_bytes": available}
    )


def _iommu_groups(source: _Source) -> dict[int, tuple[str, ...]] | None:
    if source.root is None:
        return None
    return sysfs.iommu_groups(source.root)


def _iommu_on(groups: dict[int, tuple[str, ...]] | None, source: _Source) -> bool | None:
    """On when groups exist. A live host without the directory has no IOMMU driver;
    a snapshot without it simply did not record it."""
    if groups is None:
        return False if source.live else None
    return bool(groups)


def _pci(
    view: hwloc.HwlocView,
    source: _Source,
    order: list[int],
    memory_only: set[int],
    groups: dict[int, tuple[str, ...]] | None,
) -> list[PciDevice]:
    """PCI functions that matter, plus bridges in IOMMU groups (the planner must know
    they do not block passing a group through)."""
    group_of = {bdf: g for g, members in (groups or {}).items() for bdf in members}
    normal = [n for n in order if n not in memory_only]
    out: list[PciDevice] = []
    for dev in view.pci:
        kind = classify(dev)
        node = local_node(dev, normal)
        driver: str | None = None
        group = group_of.get(dev.bdf)
        extra = sysfs.pci_device(source.root, dev.bdf) if source.root is not None else None
        if extra is not None:
            node = extra.numa_node if extra.numa_node is not None else node
            driver = extra.driver
            group = extra.iommu_group if extra.iommu_group is not None else group
        if kind == "other" and not (dev.is_bridge and group is not None):
            continue
        out.append(
            PciDevice(
                bdf=dev.bdf,
                kind=kind,
                class_id=dev.class_id,
                vendor_id=dev.vendor_id,
                device_id=dev.device_id,
                name=dev.name,
                numa_node=node,
                iommu_group=group,
                driver=driver,
                os_devices=tuple(name for name, _ in dev.os_devices),
                is_bridge=dev.is_bridge,
            )
        )
    return sorted(out, key=lambda d: d.bdf)


def _kvm(source: _Source, cpu: sysfs.CpuInfo | None) -> KvmInfo:
    if source.live:
        return live_kvm(cpu.flags if cpu else frozenset())
    what = "a sysfs snapshot" if source.root is not None else "an hwloc XML topology"
    if source.label.startswith("synthetic:"):
        what = "a synthetic topology"
    return snapshot_kvm(cpu.flags if cpu else None, source=what)


def _nohz_full(source: _Source) -> bool | None:
    """Live: the kernel's own answer. A snapshot records the file when it has it, but
    hwloc-gather-topology does not copy it, so its absence there says nothing."""
    if source.root is None:
        return None
    if source.live:
        return sysfs.has_nohz_full(source.root)
    return True if sysfs.has_nohz_full(source.root) else None


def _hostname(view: hwloc.HwlocView, source: _Source) -> str:
    """Live: this host. XML: what the file records. A sysfs snapshot: unknown (hwloc
    fills HostName from the machine that reads the snapshot, not the one it shows)."""
    if source.live:
        return socket.gethostname()
    if source.root is None:
        return view.infos.get("HostName", "")
    return ""
