"""What hwloc does not give, read from the same file-system root ("/" for this host,
or the folder of an hwloc-gather-topology snapshot): huge page pools with free counts,
THP mode, CPU flags, IOMMU groups, PCI driver/NUMA node/group, hugetlbfs mounts.

Every reader takes the root explicitly so that nothing of the live host leaks into a
snapshot. Missing files mean "unknown", never an error: snapshots omit many of them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hpcvm.units import KIB, parse_cpu_list

_HUGEPAGES_DIR = re.compile(r"^hugepages-(\d+)kB$")


def read_text(path: Path) -> str | None:
    """File contents, or None when missing or unreadable (permission, a dangling link)."""
    try:
        return path.read_text(errors="replace")
    except (OSError, ValueError):
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class Pool:
    size_bytes: int
    total: int
    free: int | None


def node_hugepages(root: Path, node: int) -> list[Pool]:
    """Per-node pools from sys/devices/system/node/nodeN/hugepages/hugepages-<K>kB."""
    return _pools(root / "sys" / "devices" / "system" / "node" / f"node{node}" / "hugepages")


def global_hugepages(root: Path) -> list[Pool]:
    """System-wide pools from sys/kernel/mm/hugepages: all there is on a kernel without
    NUMA support, where they are the one node's pools."""
    return _pools(root / "sys" / "kernel" / "mm" / "hugepages")


def _pools(base: Path) -> list[Pool]:
    pools: list[Pool] = []
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return pools
    for entry in entries:
        match = _HUGEPAGES_DIR.match(entry.name)
        if not match:
            continue
        total = read_int(entry / "nr_hugepages")
        if total is None:
            continue
        pools.append(Pool(int(match.group(1)) * KIB, total, read_int(entry / "free_hugepages")))
    return sorted(pools, key=lambda p: p.size_bytes)


def node_meminfo(root: Path, node: int) -> dict[str, int]:
    """sys/devices/system/node/nodeN/meminfo in bytes ("Node 0 MemFree: 12 kB")."""
    text = read_text(root / "sys" / "devices" / "system" / "node" / f"node{node}" / "meminfo")
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        # "Node", N, "Key:", value, ["kB"]
        if len(parts) >= 4 and parts[0] == "Node" and parts[3].isdigit():
            value = int(parts[3])
            out[parts[2].rstrip(":")] = value * KIB if parts[4:5] == ["kB"] else value
    return out


def node_cpus(root: Path, node: int) -> list[int] | None:
    """The CPUs the kernel lists for a node (offline ones included on most kernels);
    used only to place offline CPUs that hwloc cannot place."""
    text = read_text(root / "sys" / "devices" / "system" / "node" / f"node{node}" / "cpulist")
    if text is None:
        return None
    try:
        return parse_cpu_list(text)
    except ValueError:
        return None


def node_distances(root: Path, nodes: list[int]) -> list[list[int]] | None:
    """The kernel's distance matrix (node/nodeN/distance, one row per node, columns in
    the order of node/online or of the nodeN folders), restricted to ``nodes``; None
    when incomplete."""
    base = root / "sys" / "devices" / "system" / "node"
    online = read_text(base / "online")
    try:
        columns = parse_cpu_list(online) if online else _node_dirs(base)
    except ValueError:
        columns = None
    if not columns or not set(nodes) <= set(columns):
        return None
    rows: list[list[int]] = []
    for node in nodes:
        text = read_text(base / f"node{node}" / "distance")
        try:
            values = [int(v) for v in (text or "").split()]
        except ValueError:
            return None
        if len(values) != len(columns):
            return None
        rows.append([values[columns.index(other)] for other in nodes])
    return rows


def _node_dirs(base: Path) -> list[int]:
    """Node numbers of the nodeN folders (old kernels and some snapshots lack
    node/online; the distance columns follow the same ascending order)."""
    try:
        names = [p.name.removeprefix("node") for p in base.iterdir() if p.name.startswith("node")]
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def thp_mode(root: Path) -> str | None:
    """The bracketed word of sys/kernel/mm/transparent_hugepage/enabled."""
    text = read_text(root / "sys" / "kernel" / "mm" / "transparent_hugepage" / "enabled")
    if text is None:
        return None
    match = re.search(r"\[(\w+)\]", text)
    return match.group(1) if match else None


def has_nohz_full(root: Path) -> bool:
    """Whether the kernel under ``root`` was built with CONFIG_NO_HZ_FULL: only then
    does it have sys/devices/system/cpu/nohz_full (and honour ``nohz_full=``)."""
    return (root / "sys" / "devices" / "system" / "cpu" / "nohz_full").exists()


def meminfo(root: Path) -> dict[str, int]:
    """proc/meminfo as bytes (values in kB are converted; counts kept as they are)."""
    out: dict[str, int] = {}
    for line in (read_text(root / "proc" / "meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        value = int(parts[0])
        out[key.strip()] = value * KIB if parts[1:2] == ["kB"] else value
    return out


def uninitialised_pages(root: Path) -> dict[int, int]:
    """Node -> pages its zones have but the buddy allocator does not manage yet, from
    proc/zoneinfo (``present`` - ``managed``, summed over the node's zones): under
    ``deferred_init=lazy`` the memory the kernel initialises only when asked (plus a
    little reserved memory). Empty when the root has no zoneinfo."""
    gaps: dict[int, int] = {}
    node: int | None = None
    present = 0
    for line in (read_text(root / "proc" / "zoneinfo") or "").splitlines():
        fields = line.replace(",", " ").split()
        if len(fields) >= 2 and fields[0] == "Node" and fields[1].isdigit():
            node, present = int(fields[1]), 0
        elif node is not None and len(fields) == 2 and fields[1].isdigit():
            if fields[0] == "present":
                present = int(fields[1])
            elif fields[0] == "managed":
                gaps[node] = gaps.get(node, 0) + max(0, present - int(fields[1]))
    return gaps


def hugetlbfs_mounts(root: Path) -> dict[int, str]:
    """Page size in bytes -> a hugetlbfs mount point, from proc/mounts; a mount without
    pagesize= uses the default huge page size (meminfo Hugepagesize). Of several mounts
    of one size on this machine, the first this process may create files in wins (a
    user's group mount, ``gid=...,mode=1770``, over root's ``/dev/hugepages``); else the
    first."""
    default = meminfo(root).get("Hugepagesize")
    mounts: dict[int, str] = {}
    live = root == Path("/")
    for line in (read_text(root / "proc" / "mounts") or "").splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] != "hugetlbfs":
            continue
        size = default
        for option in fields[3].split(","):
            if option.startswith("pagesize="):
                size = _size_option(option.removeprefix("pagesize="))
        if size:
            path = fields[1].replace("\\040", " ")
            usable = live and os.access(path, os.W_OK | os.X_OK)
            if size not in mounts or (usable and not os.access(mounts[size], os.W_OK | os.X_OK)):
                mounts[size] = path
    return mounts


def _size_option(text: str) -> int | None:
    match = re.fullmatch(r"(\d+)([kKmMgG]?)", text.strip())
    if not match:
        return None
    factor = {"": 1, "k": KIB, "m": KIB**2, "g": KIB**3}[match.group(2).lower()]
    return int(match.group(1)) * factor


# --------------------------------------------------------------------------- cpu


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]


def cpuinfo(root: Path) -> CpuInfo | None:
    """Model name and flags of the first processor in proc/cpuinfo (x86 "model name" /
    "flags"; POWER "cpu"; ARM "Features")."""
    text = read_text(root / "proc" / "cpuinfo")
    if text is None:
        return None
    model = ""
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key in ("model name", "cpu") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model, flags)


# --------------------------------------------------------------------------- iommu / pci


def iommu_groups(root: Path) -> dict[int, tuple[str, ...]] | None:
    """Group number -> member BDFs from sys/kernel/iommu_groups; None when the
    directory does not exist (a snapshot that did not record it, or no IOMMU driver)."""
    base = root / "sys" / "kernel" / "iommu_groups"
    if not base.is_dir():
        return None
    groups: dict[int, tuple[str, ...]] = {}
    for entry in base.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            members = sorted(d.name.lower() for d in (entry / "devices").iterdir())
        except OSError:
            members = []
        groups[int(entry.name)] = tuple(members)
    return dict(sorted(groups.items()))


@dataclass(frozen=True)
class PciSysfs:
    numa_node: int | None
    driver: str | None
    iommu_group: int | None


def pci_device(root: Path, bdf: str) -> PciSysfs | None:
    """numa_node, bound driver and IOMMU group of sys/bus/pci/devices/<bdf>. The links
    are resolved by name only: in a snapshot they may point outside it."""
    base = root / "sys" / "bus" / "pci" / "devices" / bdf
    if not base.exists() and not base.is_symlink():
        return None
    node = read_int(base / "numa_node")
    return PciSysfs(
        numa_node=node if node is not None and node >= 0 else None,
        driver=_link_name(base / "driver"),
        iommu_group=_int_or_none(_link_name(base / "iommu_group")),
    )


def _link_name(path: Path) -> str | None:
    try:
        return Path(path.readlink()).name if path.is_symlink() else None
    except OSError:
        return None


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


# --------------------------------------------------------------------------- cgroup

UNLIMITED = 1 << 60  # a cgroup v1 limit at or above this means none


def memory_limit(root: Path = Path("/")) -> int | None:
    """This process's cgroup memory limit in bytes (the smallest of its cgroup's and its
    ancestors'), None when there is none: what a batch job's memory request (Slurm's
    task/cgroup with ConstrainRAMSpace) lets its processes, QEMU included, be charged."""
    try:
        lines = (root / "proc" / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            stat = root / "sys" / "fs" / "cgroup" / "memory" / path.lstrip("/") / "memory.stat"
            return _v1_limit(stat)
    for line in lines:
        if line.startswith("0::"):  # cgroup v2: memory.max here and above
            return _v2_limit(root / "sys" / "fs" / "cgroup", line[3:])
    return None


def _v1_limit(stat: Path) -> int | None:
    try:
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "hierarchical_memory_limit":
                limit = int(value)
                return None if limit >= UNLIMITED else limit
    except (OSError, ValueError):
        pass
    return None


def _v2_limit(base: Path, path: str) -> int | None:
    limits = []
    current = Path(path)
    while True:
        text = (
            read_text(base / current.relative_to("/") / "memory.max")
            if str(current) != "/"
            else None
        )
        if text and text.strip() != "max" and text.strip().isdigit():
            limits.append(int(text.strip()))
        if str(current) == "/":
            break
        current = current.parent
    return min(limits) if limits else None
