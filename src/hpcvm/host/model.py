"""HostTopology: everything the planner needs to know about one host, and nothing it
must look up elsewhere. Produced by ``hpcvm.host.discover`` from a live host, a sysfs
snapshot or an hwloc XML file; consumed by ``hpcvm.plan`` without further I/O.

Numbers are the OS's (``os_index``): NUMA node 3 is ``node3`` in sysfs and
``host-nodes=3`` for QEMU, even when numbering is sparse.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_serializer

from hpcvm.model import Frozen

HOST_SCHEMA_VERSION = 1

DeviceKind = Literal["ethernet", "infiniband", "gpu", "nvme", "other"]
NodeKind = Literal["normal", "memory-only"]


class HugePagePool(Frozen):
    """One huge page size on one NUMA node. ``free`` is None when the source does not
    say (an hwloc XML file has totals only)."""

    size_bytes: int
    total: int
    free: int | None


class PU(Frozen):
    """A processing unit (hardware thread) as the OS numbers it.

    ``node`` is None when the CPU belongs to no NUMA node: its node is offline or
    absent, so Linux lists it in no ``node*/cpulist`` and hwloc in no node's cpuset.
    Such a CPU has no local memory; claiming one would make a "mirrored" guest lie.
    """

    os_index: int
    core: int  # index into HostTopology.cores
    package: int  # os_index of the package (socket); -1 when unknown
    node: int | None  # os_index of the NUMA node holding it; None: no local node
    online: bool = True
    allowed: bool = True  # False when outside this process's cpuset (cgroup)


class Core(Frozen):
    """A physical core and its SMT siblings, lowest PU first."""

    index: int  # position in HostTopology.cores
    os_index: int | None  # core id within its package, when known
    package: int
    node: int | None  # None: its PUs have no local NUMA node (see PU)
    pus: tuple[int, ...]  # os_index of its PUs (online or not)


class Package(Frozen):
    os_index: int
    nodes: tuple[int, ...]
    cpu_model: str = ""


class NumaNode(Frozen):
    """A NUMA node. ``kind`` is "memory-only" for nodes without PUs (GPU memory, HBM,
    CXL, NVDIMM); ``subtype`` carries what hwloc says about it (e.g. "GPUMemory")."""

    os_index: int
    memory_bytes: int
    pus: tuple[int, ...]  # os_index of online+offline PUs local to this node
    hugepages: tuple[HugePagePool, ...] = ()
    kind: NodeKind = "normal"
    subtype: str | None = None
    # False when outside this process's memory set (cgroup cpuset.mems): the kernel
    # refuses memory bound there, so plans never bind to it.
    allowed: bool = True
    # What the kernel can give now without swapping: MemAvailable on a host of one node,
    # else MemFree + Inactive(file) of the node's meminfo; memory the kernel has not yet
    # initialised (deferred_init=lazy) is counted here and in memory_bytes on the node
    # holding it (host/discover.py). None when the source does not say (XML, synthetic).
    available_bytes: int | None = None

    def pool(self, size_bytes: int) -> HugePagePool | None:
        """The pool of the given page size on this node, if the node has one."""
        for p in self.hugepages:
            if p.size_bytes == size_bytes:
                return p
        return None


class Cache(Frozen):
    """A cache shared by at least one PU; ``pus`` are OS indexes."""

    level: int
    kind: Literal["unified", "data", "instruction"] = "unified"
    size_bytes: int
    pus: tuple[int, ...]


class PciDevice(Frozen):
    """A PCI function that matters for HPC guests (NIC, HCA, GPU, NVMe) or a bridge in
    an IOMMU group. ``bdf`` is the full ``dddd:bb:dd.f`` address."""

    bdf: str
    kind: DeviceKind
    class_id: int  # PCI class << 8 | subclass, e.g. 0x0200 Ethernet
    vendor_id: int
    device_id: int
    name: str = ""
    numa_node: int | None = None  # None when the firmware does not say (-1 in sysfs)
    iommu_group: int | None = None
    driver: str | None = None
    os_devices: tuple[str, ...] = ()  # e.g. ("eth0",), ("mlx5_0", "ib0")
    is_bridge: bool = False


class KvmInfo(Frozen):
    """Whether this host can run an ordinary KVM guest.

    ``device`` None means the source cannot tell (a snapshot has no /dev); ``hw_virt``
    None that it records no CPU flags (an hwloc XML file). ``pvm`` is set when the
    paravirtual kvm_pvm module is loaded: /dev/kvm works but only PVM guest kernels boot
    on it, so an ordinary guest would hang.
    """

    device: bool | None
    hw_virt: bool | None  # vmx or svm in the CPU flags; None: no flags recorded
    pvm: bool = False
    usable: bool
    reason: str  # one sentence a person can act on


class HostTopology(Frozen):
    """One host as the planner sees it. Tuples are sorted by os_index."""

    schema_version: int = HOST_SCHEMA_VERSION
    source: str  # "live", "sysfs:<dir>", "xml:<file>"
    hostname: str = ""
    cpu_model: str = ""
    cpu_flags: frozenset[str] = frozenset()
    packages: tuple[Package, ...]
    nodes: tuple[NumaNode, ...]
    cores: tuple[Core, ...]
    pus: tuple[PU, ...]
    caches: tuple[Cache, ...] = ()
    distances: tuple[tuple[int, ...], ...]  # rows/cols in the order of ``nodes``
    thp: str | None = None  # "always", "madvise", "never"; None when unknown
    # The kernel was built with CONFIG_NO_HZ_FULL (it has sys/devices/system/cpu/nohz_full),
    # so a nohz_full= argument would take effect; None when the source does not say.
    nohz_full: bool | None = None
    kvm: KvmInfo
    iommu: bool | None = None  # None when unknown
    # IOMMU group number -> member BDFs
    iommu_groups: dict[int, tuple[str, ...]] = Field(default_factory=dict)
    # page size in bytes -> hugetlbfs mount point (live host only)
    hugetlbfs_mounts: dict[int, str] = Field(default_factory=dict)
    # This process's cgroup memory limit (a batch job's memory request); None: none, or
    # not a live host. Guest RAM on huge pages is not charged to it (no hugetlb limit).
    memory_limit: int | None = None
    pci: tuple[PciDevice, ...] = ()
    warnings: tuple[str, ...] = ()

    @field_serializer("cpu_flags")
    def _sorted_flags(self, flags: frozenset[str]) -> list[str]:
        """Sorted, so the JSON of one host is the same on every run (diffable, storable)."""
        return sorted(flags)

    def node(self, os_index: int) -> NumaNode:
        for n in self.nodes:
            if n.os_index == os_index:
                return n
        raise KeyError(os_index)

    def pu(self, os_index: int) -> PU:
        for p in self.pus:
            if p.os_index == os_index:
                return p
        raise KeyError(os_index)

    def distance(self, a: int, b: int) -> int:
        """Distance between NUMA nodes with OS indexes ``a`` and ``b``."""
        order = [n.os_index for n in self.nodes]
        return self.distances[order.index(a)][order.index(b)]

    def usable_pus(self) -> tuple[PU, ...]:
        """PUs a VM may be pinned to: online and allowed."""
        return tuple(p for p in self.pus if p.online and p.allowed)

    def allowed_nodes(self) -> tuple[NumaNode, ...]:
        """Normal nodes guest memory may be bound to (inside cpuset.mems)."""
        return tuple(n for n in self.nodes if n.allowed and n.kind == "normal")

    def nodeless_pus(self) -> tuple[int, ...]:
        """PUs (online or not) that belong to no NUMA node."""
        return tuple(p.os_index for p in self.pus if p.node is None)
