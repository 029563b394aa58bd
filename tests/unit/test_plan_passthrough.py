"""Passthrough planning on the 40intel64-2g2n4c+pci snapshot (an InfiniBand HCA at
0000:43:00.0 on host node 2).

FAKE, on purpose: the snapshot records no IOMMU groups, and this machine has no IOMMU or
VFIO device to take them from, so the tests give the snapshot's HostTopology IOMMU
groups (and a second function or a bridge in the HCA's group) with model_copy. Only the
IOMMU facts are invented; CPUs, nodes, distances and the device itself are the real
machine's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.host import HostTopology
from hpcvm.host.model import PciDevice
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest
from hpcvm.units import GIB
from tests.conftest import sysfs_root
from tests.plan_checks import check_plan, host_from, roomy

HCA = "0000:43:00.0"
SECOND = "0000:43:00.1"
GROUP = 7


@pytest.fixture(scope="module")
def base(snapshots_dir: Path) -> HostTopology:
    host = roomy(host_from("sysfs", str(sysfs_root(snapshots_dir, "40intel64-2g2n4c+pci"))))
    hca = next(d for d in host.pci if d.bdf == HCA)
    assert hca.numa_node == 2 and hca.iommu_group is None, "the snapshot as recorded"
    return host


def _grouped(host: HostTopology, *, second_is_bridge: bool | None) -> HostTopology:
    """IOMMU on; the HCA in group 7, with a second function (endpoint or bridge) or alone."""
    pci = [d.model_copy(update={"iommu_group": GROUP}) if d.bdf == HCA else d for d in host.pci]
    members = [HCA]
    if second_is_bridge is not None:
        pci.append(
            PciDevice(
                bdf=SECOND,
                kind="other",
                class_id=0x0604 if second_is_bridge else 0x0207,
                vendor_id=0x15B3,
                device_id=0x1003,
                numa_node=2,
                iommu_group=GROUP,
                is_bridge=second_is_bridge,
            )
        )
        members.append(SECOND)
    return host.model_copy(
        update={"pci": tuple(pci), "iommu": True, "iommu_groups": {GROUP: tuple(members)}}
    )


def _req(*bdfs: str, vcpus: int = 4) -> PlanRequest:
    return PlanRequest(profile="hpc", vcpus=vcpus, memory_bytes=2 * GIB, passthrough=bdfs)


def test_device_alone_in_its_group_is_passed_and_vcpus_go_to_its_node(base: HostTopology) -> None:
    host = _grouped(base, second_is_bridge=None)
    request = _req("43:00.0")  # short form, normalised
    p = plan(host, request)
    check_plan(host, request, p)
    (dev,) = p.passthrough
    assert dev.bdf == HCA and dev.iommu_group == GROUP and dev.host_node == 2
    assert [n.host_node for n in p.guest_nodes] == [2], "vCPUs prefer the device's node"
    assert dev.guest_node == 0


def test_device_node_comes_first_when_more_nodes_are_needed(base: HostTopology) -> None:
    host = _grouped(base, second_is_bridge=None)
    per_node = 9  # 10 PUs per node minus one housekeeping core
    p = plan(host, _req(HCA, vcpus=per_node + 1))
    used = [n.host_node for n in p.guest_nodes]
    assert 2 in used and len(used) == 2
    (dev,) = p.passthrough
    assert p.guest_nodes[dev.guest_node].host_node == 2  # type: ignore[index]


def test_another_endpoint_in_the_group_is_refused_by_name(base: HostTopology) -> None:
    host = _grouped(base, second_is_bridge=False)
    with pytest.raises(InfeasiblePlanError, match=rf"IOMMU group {GROUP} also holds {SECOND}"):
        plan(host, _req(HCA))


def test_a_bridge_in_the_group_is_fine(base: HostTopology) -> None:
    host = _grouped(base, second_is_bridge=True)
    request = _req(HCA)
    p = plan(host, request)
    check_plan(host, request, p)
    assert p.passthrough[0].group_members == ()


def test_passing_the_whole_group_is_fine(base: HostTopology) -> None:
    host = _grouped(base, second_is_bridge=False)
    p = plan(host, _req(HCA, SECOND))
    assert [d.bdf for d in p.passthrough] == [HCA, SECOND]
    assert p.passthrough[0].group_members == (SECOND,)


def test_iommu_off_is_refused_with_the_boot_options(base: HostTopology) -> None:
    host = _grouped(base, second_is_bridge=None).model_copy(update={"iommu": False})
    with pytest.raises(InfeasiblePlanError, match=r"IOMMU is off: boot the host with intel_iommu"):
        plan(host, _req(HCA))


def test_unknown_group_is_refused(base: HostTopology) -> None:
    with pytest.raises(InfeasiblePlanError, match=r"has no IOMMU groups"):
        plan(base, _req(HCA))


def test_unknown_device_lists_the_candidates(base: HostTopology) -> None:
    host = _grouped(base, second_is_bridge=None)
    with pytest.raises(UsageError) as info:
        plan(host, _req("0000:99:00.0"))
    text = str(info.value)
    assert "0000:99:00.0 is not on this host" in text
    assert all(d.bdf in text for d in host.pci if not d.is_bridge)


@pytest.mark.parametrize("bdf", ["43:00", "zz:00.0", "0000:43:00.9", ""])
def test_malformed_address_is_a_usage_error(base: HostTopology, bdf: str) -> None:
    with pytest.raises(UsageError, match="is not a PCI address"):
        plan(base, _req(bdf))


def test_listing_a_device_twice_is_a_usage_error(base: HostTopology) -> None:
    host = _grouped(base, second_is_bridge=None)
    with pytest.raises(UsageError, match="more than once"):
        plan(host, _req(HCA, "43:00.0"))


def test_two_devices_on_two_nodes_with_one_vcpu(base: HostTopology) -> None:
    """Both devices' nodes are preferred, but one vCPU fits one node: the other device's
    node holds no vCPU, and the plan warns that its DMA crosses the interconnect."""
    host = _grouped(base, second_is_bridge=None)
    nic = PciDevice(
        bdf="0000:81:00.0", kind="ethernet", class_id=0x0200, vendor_id=0x8086,
        device_id=0x10FB, numa_node=3, iommu_group=GROUP + 1,
    )  # fmt: skip
    groups = {**host.iommu_groups, GROUP + 1: (nic.bdf,)}
    host = host.model_copy(update={"pci": (*host.pci, nic), "iommu_groups": groups})
    request = _req(HCA, nic.bdf, vcpus=1)
    p = plan(host, request)
    check_plan(host, request, p)
    assert len(p.guest_nodes) == 1
    homeless = [d for d in p.passthrough if d.guest_node is None]
    assert len(homeless) == 1 and any(homeless[0].bdf in w for w in p.warnings)
    both = plan(host, _req(HCA, nic.bdf, vcpus=2))
    assert [n.host_node for n in both.guest_nodes] == [2, 3]
    assert all(d.guest_node is not None for d in both.passthrough)
