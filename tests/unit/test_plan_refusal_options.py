"""Every planner refusal names, as data (``HpcvmError.option``), the request field it is
about; ``hpcvm bench`` turns that field into its own option.

Oracle: each case's request is wrong in one field only, on a real snapshot (made roomy,
or given known pools, KVM or IOMMU facts with model_copy where the snapshot cannot say);
the test's own table says which field that is, and changing that field alone (to the
case's fix) makes the same host plan it. So an ``option`` naming any other field fails,
and so does a refusal that was not about the field at all.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hpcvm.bench.envs.vm import plan_vm
from hpcvm.errors import HpcvmError, InfeasiblePlanError, UsageError
from hpcvm.host import HostTopology
from hpcvm.host.model import KvmInfo
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest
from hpcvm.units import GIB, MIB
from tests.conftest import TOPOLOGIES, sysfs_root
from tests.plan_checks import host_from, roomy, usable_cores, with_pools

TWO_M = 2 * MIB
PCI_SNAP = "40intel64-2g2n4c+pci"  # 4 nodes of 10 PUs, an InfiniBand HCA at 43:00.0
HCA = "0000:43:00.0"

Load = Callable[[str], HostTopology]
Make = Callable[[Load], HostTopology]


@pytest.fixture(scope="module")
def snap(snapshots_dir: Path) -> Load:
    def load(name: str) -> HostTopology:
        if name.startswith("xml:"):
            return host_from("xml", str(TOPOLOGIES / "xml" / f"{name[4:]}.xml"))
        return host_from("sysfs", str(sysfs_root(snapshots_dir, name)))

    return load


def _roomy(name: str, memory: int = 32 * GIB) -> Make:
    return lambda load: roomy(load(name), memory)


def _small_memory(load: Load) -> HostTopology:
    """8G of ordinary memory per node and no huge pages: memory decides the nodes."""
    host = with_pools(roomy(load(PCI_SNAP), 8 * GIB), TWO_M, total=0, free=0)
    return with_pools(host, GIB, total=0, free=0)


def _few_free_pages(load: Load) -> HostTopology:
    return with_pools(roomy(load(PCI_SNAP)), TWO_M, total=300, free=250)


def _no_kvm(load: Load) -> HostTopology:
    kvm = KvmInfo(device=True, hw_virt=False, usable=False, reason="test: no VT-x")
    return roomy(load(PCI_SNAP)).model_copy(update={"kvm": kvm})


def _no_memory_node_allowed(load: Load) -> HostTopology:
    host = roomy(load(PCI_SNAP))
    nodes = tuple(n.model_copy(update={"allowed": False}) for n in host.nodes)
    return host.model_copy(update={"nodes": nodes})


def _iommu_off(load: Load) -> HostTopology:
    return roomy(load(PCI_SNAP)).model_copy(update={"iommu": False})


def _offline_usable(load: Load) -> int:
    host = load("16em64t-4s2c2t-offlines")
    return sum(1 for p in host.pus if p.online and p.allowed)


def _hpc_left(load: Load) -> int:
    """PUs left for vCPUs on the roomy PCI snapshot after 2 housekeeping cores per node."""
    cores = usable_cores(roomy(load(PCI_SNAP)))
    return sum(len(c) for n in cores for c in cores[n][2:])


# (id, host, request fields, the field it gets wrong, a value of that field that plans)
Case = tuple[str, Make, dict[str, object], str, object]
CASES: list[Case] = [
    ("vcpus-zero", _roomy(PCI_SNAP), {"profile": "numa", "vcpus": 0}, "vcpus", 1),
    (
        "memory-zero",
        _roomy(PCI_SNAP),
        {"profile": "numa", "vcpus": 1, "memory_bytes": 0},
        "memory_bytes",
        GIB,
    ),
    (
        "memory-not-mib",
        _roomy(PCI_SNAP),
        {"profile": "naive", "vcpus": 1, "memory_bytes": GIB + 5},
        "memory_bytes",
        GIB,
    ),
    (
        "memory-not-pages",
        _roomy(PCI_SNAP),
        {"profile": "numa", "vcpus": 1, "memory_bytes": 3 * MIB},
        "memory_bytes",
        4 * MIB,
    ),
    (
        "page-size-without-hugepages",
        _roomy(PCI_SNAP),
        {"profile": "pinned", "vcpus": 1, "page_size_bytes": TWO_M},
        "page_size_bytes",
        None,
    ),
    (
        "page-size-unknown",
        _roomy(PCI_SNAP),
        {"profile": "numa", "vcpus": 1, "page_size_bytes": 3 * MIB},
        "page_size_bytes",
        TWO_M,
    ),
    (
        "hugepages-with-4k",
        _roomy(PCI_SNAP),
        {"profile": "hugepages", "vcpus": 1, "page_size_bytes": 4096},
        "page_size_bytes",
        TWO_M,
    ),
    (
        "page-size-the-host-lacks",
        lambda load: load("2amd64-2n"),  # records neither pools nor CPU flags
        {"profile": "numa", "vcpus": 1},
        "page_size_bytes",
        4096,
    ),
    (
        "housekeeping-not-hpc",
        _roomy(PCI_SNAP),
        {"profile": "numa", "vcpus": 1, "housekeeping": 1},
        "housekeeping",
        None,
    ),
    (
        "housekeeping-negative",
        _roomy(PCI_SNAP),
        {"profile": "hpc", "vcpus": 1, "housekeeping": -1},
        "housekeeping",
        0,
    ),
    (
        "guest-nodes-not-numa",
        _roomy(PCI_SNAP),
        {"profile": "pinned", "vcpus": 2, "guest_nodes": 2},
        "guest_nodes",
        None,
    ),
    (
        "guest-nodes-zero",
        _roomy(PCI_SNAP),
        {"profile": "numa", "vcpus": 2, "guest_nodes": 0},
        "guest_nodes",
        1,
    ),
    (
        "guest-nodes-over-vcpus",
        _roomy(PCI_SNAP),
        {"profile": "numa", "vcpus": 1, "guest_nodes": 2},
        "guest_nodes",
        1,
    ),
    (
        "guest-nodes-not-a-multiple",  # 12 vCPUs use 2 host nodes of 10 PUs
        _roomy(PCI_SNAP),
        {"profile": "numa", "vcpus": 12, "guest_nodes": 3},
        "guest_nodes",
        4,
    ),
    (
        "smt-not-pinned",
        _roomy(PCI_SNAP),
        {"profile": "naive", "vcpus": 1, "smt": "pack"},
        "smt",
        None,
    ),
    (
        "smt-require-without-siblings",
        _roomy("2amd64-2n"),
        {"profile": "pinned", "vcpus": 1, "smt": "require"},
        "smt",
        "cores",
    ),
    (
        "passthrough-not-hpc",
        _roomy(PCI_SNAP),
        {"profile": "numa", "vcpus": 1, "passthrough": (HCA,)},
        "passthrough",
        (),
    ),
    (
        "passthrough-not-an-address",
        _roomy(PCI_SNAP),
        {"profile": "hpc", "vcpus": 1, "passthrough": ("43-00",)},
        "passthrough",
        (),
    ),
    (
        "passthrough-twice",
        _roomy(PCI_SNAP),
        {"profile": "hpc", "vcpus": 1, "passthrough": (HCA, "43:00.0")},
        "passthrough",
        (),
    ),
    (
        "passthrough-not-on-host",
        _roomy(PCI_SNAP),
        {"profile": "hpc", "vcpus": 1, "passthrough": ("0000:99:00.0",)},
        "passthrough",
        (),
    ),
    (
        "passthrough-without-iommu-groups",
        _roomy(PCI_SNAP),
        {"profile": "hpc", "vcpus": 1, "passthrough": (HCA,)},
        "passthrough",
        (),
    ),
    (
        "passthrough-iommu-off",
        _iommu_off,
        {"profile": "hpc", "vcpus": 1, "passthrough": (HCA,)},
        "passthrough",
        (),
    ),
    (
        "accel-kvm-without-kvm",
        _no_kvm,
        {"profile": "hpc", "vcpus": 2, "accel": "kvm"},
        "accel",
        "auto",
    ),
    (
        "memory-beyond-the-host",
        _small_memory,
        {"profile": "numa", "vcpus": 2, "memory_bytes": 100 * GIB, "page_size_bytes": 4096},
        "memory_bytes",
        GIB,
    ),
    (
        "memory-no-choice-of-nodes",
        _small_memory,
        {"profile": "numa", "vcpus": 2, "memory_bytes": 20 * GIB, "page_size_bytes": 4096},
        "memory_bytes",
        12 * GIB,
    ),
    (
        "memory-beyond-free-huge-pages",
        _few_free_pages,
        {"profile": "hugepages", "vcpus": 2, "memory_bytes": 2 * GIB},
        "memory_bytes",
        GIB,
    ),
    (
        "memory-split-over-guest-nodes",
        _roomy("64amd64-4s2n4ca2co"),
        {
            "profile": "numa",
            "vcpus": 3,
            "guest_nodes": 3,
            "memory_bytes": 2 * GIB,
            "page_size_bytes": GIB,
        },
        "memory_bytes",
        3 * GIB,
    ),
]


def _req(fields: dict[str, object]) -> PlanRequest:
    return PlanRequest.model_validate({"memory_bytes": GIB, **fields})


@pytest.mark.parametrize(
    ("make", "fields", "option", "fix"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_a_refusal_names_the_field_the_request_got_wrong(
    snap: Load, make: Make, fields: dict[str, object], option: str, fix: object
) -> None:
    assert option in PlanRequest.model_fields
    host = make(snap)
    request = _req(fields)
    with pytest.raises((UsageError, InfeasiblePlanError)) as info:
        plan(host, request)
    assert info.value.option == option, info.value.message
    plan(host, request.model_copy(update={option: fix}))  # that field alone was wrong


def test_too_many_vcpus_names_vcpus_with_the_cause_apart(snap: Load) -> None:
    """More vCPUs than online PUs, and than the PUs housekeeping leaves: both are about
    --vcpus; ``cause`` says separately whether housekeeping took the PUs."""
    host = snap("16em64t-4s2c2t-offlines")
    usable = _offline_usable(snap)
    request = _req({"profile": "pinned", "vcpus": usable + 1})
    with pytest.raises(InfeasiblePlanError) as info:
        plan(host, request)
    assert (info.value.option, info.value.cause) == ("vcpus", "vcpus")
    plan(host, request.model_copy(update={"vcpus": usable}))

    host = roomy(snap(PCI_SNAP))
    left = _hpc_left(snap)
    request = _req({"profile": "hpc", "vcpus": left + 1, "housekeeping": 2})
    with pytest.raises(InfeasiblePlanError) as info:
        plan(host, request)
    assert (info.value.option, info.value.cause) == ("vcpus", "housekeeping")
    plan(host, request.model_copy(update={"vcpus": left}))


def test_a_refusal_about_the_host_names_no_field(snap: Load) -> None:
    """No memory node inside cpuset.mems: no request field can fix that, so none is
    named, and the bench says the planner's words with the environment only."""
    host = _no_memory_node_allowed(snap)
    with pytest.raises(InfeasiblePlanError) as info:
        plan(host, _req({"profile": "numa", "vcpus": 1}))
    assert info.value.option is None
    with pytest.raises(InfeasiblePlanError) as benched:
        plan_vm("numa", vcpus=1, memory_bytes=GIB, host=host)
    assert benched.value.message == f"vm:numa: {info.value.message}"


@pytest.mark.parametrize(
    ("profile", "make", "sizes", "bench_option"),
    [
        ("pinned", _roomy(PCI_SNAP), {"vcpus": 41}, "--vm-vcpus or the largest --np"),
        (
            "numa",
            _small_memory,
            {"vcpus": 2, "memory_bytes": 100 * GIB},
            "is --vm-memory",
        ),
        (
            "numa",
            _roomy(PCI_SNAP),
            {"vcpus": 12, "guest_nodes": 3},
            "is --vm-guest-nodes",
        ),
        (
            "hugepages",
            lambda load: load("2amd64-2n"),
            {"vcpus": 1},
            "the VM's --page-size is the environment's +page=4K|2M|1G",
        ),
    ],
)
def test_bench_says_the_refusal_in_its_own_options(
    snap: Load, profile: str, make: Make, sizes: dict[str, int], bench_option: str
) -> None:
    """The bench's message is the planner's, prefixed with the environment, plus the
    bench option behind the field the refusal is about (and only that one)."""
    host = make(snap)
    kw = {"vcpus": 1, "memory_bytes": GIB, "guest_nodes": None, **sizes}
    with pytest.raises(HpcvmError) as planned:
        plan(host, _req({"profile": profile, **kw}))
    with pytest.raises(HpcvmError) as benched:
        plan_vm(profile, host=host, **kw)  # type: ignore[arg-type]
    said = benched.value.message
    assert type(benched.value) is type(planned.value)
    assert benched.value.option == planned.value.option
    assert said.startswith(f"vm:{profile}: {planned.value.message} (")
    assert bench_option in said
    others = {"--vm-vcpus", "--vm-memory", "--vm-guest-nodes"} - {
        o for o in ("--vm-vcpus", "--vm-memory", "--vm-guest-nodes") if o in bench_option
    }
    assert not any(o in said for o in others), said
    assert "\n" not in said
