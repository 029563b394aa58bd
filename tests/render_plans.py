"""Hand-built VMPlans for the renderer tests, one per profile shape.

Written by hand (not by the planner) so the renderer tests do not depend on the planner
and each plan states its expected guest in plain data that the tests compare the
rendered output against. ``FITS_HERE`` are the plans this machine can start under TCG
(2 PUs, one NUMA node); the others exercise what cannot run here (KVM, VFIO, 1 GiB
pages, two host nodes, SMT) and are only rendered and validated.

At the end, helpers that ask the real planner for plans on snapshots (``plans_for``).
"""

from __future__ import annotations

from hpcvm.errors import HpcvmError
from hpcvm.host import HostTopology, discover
from hpcvm.host.model import HugePagePool
from hpcvm.plan import plan as make_plan
from hpcvm.plan.model import (
    AccelChoice,
    CpuModel,
    CpuTopology,
    GuestNode,
    MemoryRegion,
    PassthroughDevice,
    PlanRequest,
    ProfileName,
    VcpuPlacement,
    VMPlan,
)
from tests.conftest import Snapshot

MIB = 1024 * 1024
GIB = 1024 * MIB
PAGE_4K = 4096
PAGE_2M = 2 * MIB
PAGE_1G = GIB
HUGETLBFS = "/dev/hugepages"


def _request(name: str, profile: ProfileName, vcpus: int, memory: int) -> PlanRequest:
    return PlanRequest(name=name, profile=profile, vcpus=vcpus, memory_bytes=memory, accel="tcg")


def _flat_placements(
    pus: list[int | None], cores: int, threads: int = 1
) -> tuple[VcpuPlacement, ...]:
    """cpu-index order on one socket: core-major, thread-minor."""
    return tuple(
        VcpuPlacement(
            vcpu=i, socket=0, core=i // threads, thread=i % threads, guest_node=None, host_pu=pu
        )
        for i, pu in enumerate(pus)
    )


def naive(name: str = "r-naive", vcpus: int = 2, memory: int = 512 * MIB) -> VMPlan:
    """QEMU defaults: flat, one socket of N cores, unpinned, anonymous memory, qemu64."""
    return VMPlan(
        name=name,
        profile="naive",
        request=_request(name, "naive", vcpus, memory),
        host_source="hand-built",
        accel="tcg",
        accel_reason="test",
        vcpus=vcpus,
        memory_bytes=memory,
        topology=CpuTopology(sockets=1, cores=vcpus, threads=1),
        placements=_flat_placements([None] * vcpus, vcpus),
        guest_nodes=(),
        guest_distances=(),
        memory=(
            MemoryRegion(
                id="ram", size_bytes=memory, guest_node=None, backend="ram", page_size_bytes=PAGE_4K
            ),
        ),
        page_size_bytes=PAGE_4K,
        cpu=CpuModel(model=None),
        clock="tsc",
    )


def pinned(name: str = "r-pinned") -> VMPlan:
    """Flat, 2 vCPUs pinned 1:1 to PUs 0 and 1; still anonymous memory."""
    plan = naive(name)
    return plan.model_copy(
        update={
            "profile": "pinned",
            "request": _request(name, "pinned", 2, plan.memory_bytes),
            "placements": _flat_placements([0, 1], 2),
        }
    )


def hugepages(name: str = "r-huge") -> VMPlan:
    """Flat, pinned, all RAM in one preallocated 2M hugetlbfs backend (not bound)."""
    plan = pinned(name)
    region = MemoryRegion(
        id="ram",
        size_bytes=plan.memory_bytes,
        guest_node=None,
        backend="file",
        page_size_bytes=PAGE_2M,
        mem_path=HUGETLBFS,
        prealloc=True,
    )
    return plan.model_copy(
        update={
            "profile": "hugepages",
            "request": _request(name, "hugepages", 2, plan.memory_bytes),
            "memory": (region,),
            "page_size_bytes": PAGE_2M,
            "hugepages_needed": {0: plan.memory_bytes // PAGE_2M},
        }
    )


def _node_region(guest: int, host: int, size: int, page: int) -> MemoryRegion:
    huge = page != PAGE_4K
    return MemoryRegion(
        id=f"mem{guest}",
        size_bytes=size,
        guest_node=guest,
        backend="file" if huge else "ram",
        page_size_bytes=page,
        mem_path=(HUGETLBFS if page == PAGE_2M else "/dev/hugepages1G") if huge else None,
        host_nodes=(host,),
        policy="bind",
        prealloc=True,
    )


def numa(name: str = "r-numa", page: int = PAGE_2M) -> VMPlan:
    """Two guest nodes (one vCPU and 256M each), both bound to host node 0 (this machine
    has one node), on 2M pages; distance 20 between them."""
    size = 256 * MIB
    placements = tuple(
        VcpuPlacement(vcpu=i, socket=0, core=i, thread=0, guest_node=i, host_pu=i) for i in range(2)
    )
    return VMPlan(
        name=name,
        profile="numa",
        request=_request(name, "numa", 2, 2 * size).model_copy(update={"guest_nodes": 2}),
        host_source="hand-built",
        accel="tcg",
        accel_reason="test",
        vcpus=2,
        memory_bytes=2 * size,
        topology=CpuTopology(sockets=1, cores=2, threads=1),
        placements=placements,
        guest_nodes=tuple(
            GuestNode(index=i, host_node=0, vcpus=(i,), memory_bytes=size) for i in range(2)
        ),
        guest_distances=((10, 20), (20, 10)),
        memory=tuple(_node_region(i, 0, size, page) for i in range(2)),
        page_size_bytes=page,
        hugepages_needed={0: 2 * size // page} if page != PAGE_4K else {},
        cpu=CpuModel(model=None),
        clock="tsc",
    )


def hpc_tcg(name: str = "r-hpc-tcg") -> VMPlan:
    """hpc as it fits here: one vCPU on PU 1, emulator and one I/O thread on the
    housekeeping PU 0, one guest node on host node 0 with 2M pages, ``-cpu max``."""
    size = 512 * MIB
    return VMPlan(
        name=name,
        profile="hpc",
        request=_request(name, "hpc", 1, size),
        host_source="hand-built",
        accel="tcg",
        accel_reason="test",
        vcpus=1,
        memory_bytes=size,
        topology=CpuTopology(sockets=1, cores=1, threads=1),
        placements=(VcpuPlacement(vcpu=0, socket=0, core=0, thread=0, guest_node=0, host_pu=1),),
        guest_nodes=(GuestNode(index=0, host_node=0, vcpus=(0,), memory_bytes=size),),
        guest_distances=((10,),),
        memory=(_node_region(0, 0, size, PAGE_2M),),
        page_size_bytes=PAGE_2M,
        hugepages_needed={0: size // PAGE_2M},
        emulator_pus=(0,),
        iothreads=1,
        iothread_pus=(0,),
        housekeeping_pus=(0,),
        cpu=CpuModel(model="max"),
        clock="tsc",
    )


def hpc_kvm(name: str = "r-hpc-kvm") -> VMPlan:
    """hpc on a two-node SMT host under KVM (cannot run here): 8 vCPUs as 2 sockets x
    2 cores x 2 threads pinned to siblings, two guest nodes on host nodes 0 and 1 with
    1G pages, distance 21, host CPU + invtsc, emulator/iothreads on housekeeping PUs,
    and an InfiniBand HCA passed with its second function."""
    size = 2 * GIB
    host_pus = [2, 34, 3, 35, 18, 50, 19, 51]  # sibling pairs (n, n+32)
    placements = tuple(
        VcpuPlacement(
            vcpu=i,
            socket=i // 4,
            core=(i // 2) % 2,
            thread=i % 2,
            guest_node=i // 4,
            host_pu=pu,
        )
        for i, pu in enumerate(host_pus)
    )
    device = PassthroughDevice(
        bdf="0000:3b:00.0",
        kind="infiniband",
        host_node=0,
        iommu_group=40,
        guest_node=0,
        group_members=("0000:3b:00.1",),
    )
    return VMPlan(
        name=name,
        profile="hpc",
        request=_request(name, "hpc", 8, 2 * size).model_copy(
            update={"accel": "kvm", "passthrough": ("3b:00.0",)}
        ),
        host_source="hand-built",
        accel="kvm",
        accel_reason="test",
        vcpus=8,
        memory_bytes=2 * size,
        topology=CpuTopology(sockets=2, cores=2, threads=2),
        placements=placements,
        guest_nodes=tuple(
            GuestNode(index=g, host_node=g, vcpus=tuple(range(4 * g, 4 * g + 4)), memory_bytes=size)
            for g in range(2)
        ),
        guest_distances=((10, 21), (21, 10)),
        memory=tuple(_node_region(g, g, size, PAGE_1G) for g in range(2)),
        page_size_bytes=PAGE_1G,
        hugepages_needed={0: 2, 1: 2},
        emulator_pus=(0, 32, 16, 48),
        iothreads=2,
        iothread_pus=(0, 16),
        housekeeping_pus=(0, 16, 32, 48),
        cpu=CpuModel(model="host", features=("invtsc",)),
        clock="kvm-clock",
        passthrough=(device,),
    )


def numa_4k(name: str = "r-numa-4k") -> VMPlan:
    """The numa shape on ordinary pages: anonymous memory, still bound per node."""
    return numa(name, page=PAGE_4K)


def all_plans() -> dict[str, VMPlan]:
    return {
        p.name: p for p in (naive(), pinned(), hugepages(), numa(), numa_4k(), hpc_tcg(), hpc_kvm())
    }


#: The plans this machine (2 PUs, 1 node, TCG, no VFIO, no 1G pool) can start.
FITS_HERE = ("r-naive", "r-pinned", "r-huge", "r-numa", "r-numa-4k", "r-hpc-tcg")


# --- plans from the planner ------------------------------------------------------------

#: (profile, page size, guest nodes) tried on every snapshot.
SHAPES: tuple[tuple[ProfileName, int | None, int | None], ...] = (
    ("naive", None, None),
    ("pinned", None, None),
    ("hugepages", None, None),
    ("numa", 4096, None),
    ("numa", None, None),
    ("numa", 4096, 2),
    ("hpc", 4096, None),
    ("hpc", None, None),
)
VCPUS = (8, 4, 2, 1)
ACCELS: tuple[AccelChoice, ...] = ("tcg", "kvm")


def snapshot_host(snap: Snapshot) -> HostTopology:
    if snap.kind == "sysfs":
        return discover(sysfs_root=snap.path)
    return discover(xml=snap.path)


def with_free_hugepages(host: HostTopology) -> HostTopology:
    """The snapshot after an administrator reserved 2M pages on every node with memory
    (the snapshots were taken with empty pools, so every hugetlbfs plan is refused)."""
    pages = 4096  # 8 GiB per node
    nodes = []
    for node in host.nodes:
        pools = [p for p in node.hugepages if p.size_bytes != PAGE_2M]
        if node.memory_bytes >= 2 * pages * PAGE_2M:
            pools.append(HugePagePool(size_bytes=PAGE_2M, total=pages, free=pages))
        nodes.append(node.model_copy(update={"hugepages": tuple(pools)}))
    return host.model_copy(update={"nodes": tuple(nodes)})


def plans_for(host: HostTopology, name: str) -> list[VMPlan]:
    """The first accepted plan per (shape, accel), largest vCPU count first."""
    found = []
    for (profile, page, nodes), accel in [(s, a) for s in SHAPES for a in ACCELS]:
        for vcpus in VCPUS:
            request = PlanRequest(
                name=f"{name}-{profile}".replace("+", "-"),  # a name `up` takes
                profile=profile,
                vcpus=vcpus,
                memory_bytes=512 * MIB,
                page_size_bytes=page,
                guest_nodes=nodes,
                accel=accel,
            )
            try:
                found.append(make_plan(host, request))
                break
            except HpcvmError:
                continue
    return found


#: Requests that fit this machine (2 PUs, one node) for ``live_plan``.
LIVE_SHAPES: dict[str, dict[str, object]] = {
    "naive": {"profile": "naive", "vcpus": 2},
    "pinned": {"profile": "pinned", "vcpus": 2},
    "hugepages": {"profile": "hugepages", "vcpus": 2},
    "numa": {"profile": "numa", "vcpus": 2, "guest_nodes": 2},
    "hpc": {"profile": "hpc", "vcpus": 1},  # the other PU is housekeeping
}
LIVE_MEMORY = 512 * MIB


def live_plan(shape: str, name: str) -> VMPlan:
    """The planner's plan for this very host (TCG). Hugetlbfs shapes need free 2M pages
    before discovery: the planner refuses a pool that cannot hold the guest."""
    request = PlanRequest.model_validate(
        {"name": name, "memory_bytes": LIVE_MEMORY, "accel": "tcg", **LIVE_SHAPES[shape]}
    )
    return make_plan(discover(), request)
