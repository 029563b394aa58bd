"""The guest ABI a restore must keep, on real machines' topologies.

A restore plans the saved request again for the host it runs on. What may change is
the host side; what may not is what the saved state depends on. The oracle for "the
host side changed" is the host itself (which PUs and nodes this process may use),
and for "the guest changed" hwloc's node count of each machine, not hpcvm's ABI code.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpcvm.bootspec import BootSpec, Nic
from hpcvm.host import HostTopology, discover
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest, VMPlan
from hpcvm.runtime.checkpoint.model import abi_differences, guest_abi
from hpcvm.units import GIB, MIB
from tests.conftest import TOPOLOGIES
from tests.plan_checks import roomy

TWO_NODES = TOPOLOGIES / "xml" / "24em64t-2n6c2t-pci.xml"
FOUR_NODES = TOPOLOGIES / "xml" / "8intel64-4n2t-memattrs.xml"
DISK = BootSpec(disk_image="/run/x/disk.qcow2", seed_image="/run/x/seed.iso")


def host_from(xml: Path) -> HostTopology:
    return roomy(discover(xml=xml))


def numa_request(vcpus: int = 2) -> PlanRequest:
    return PlanRequest(profile="numa", vcpus=vcpus, memory_bytes=2 * GIB, accel="tcg")


def node_count(xml: Path) -> int:
    """hwloc's own count of NUMA nodes in the export (the oracle)."""
    return sum(1 for o in ET.parse(xml).iter("object") if o.get("type") == "NUMANode")


def restricted(host: HostTopology, allowed: set[int]) -> HostTopology:
    """The same machine seen from a process confined to ``allowed`` PUs (a cpuset, or
    taskset: host/discover.py treats both alike)."""
    pus = tuple(p.model_copy(update={"allowed": p.os_index in allowed}) for p in host.pus)
    return host.model_copy(update={"pus": pus})


def test_the_same_machine_under_another_cpuset_keeps_the_guest() -> None:
    host = host_from(TWO_NODES)
    first = plan(host, numa_request())
    taken = set(first.vcpu_pus())
    others = {p.os_index for p in host.pus if p.os_index not in taken}
    second = plan(restricted(host, others), numa_request())
    assert set(second.vcpu_pus()).isdisjoint(taken)  # the host side moved...
    assert abi_differences(guest_abi(first, DISK), guest_abi(second, DISK)) == []  # ...not ABI


def test_hugepages_on_another_host_node_keep_the_guest() -> None:
    """Memory bound elsewhere is host side: a numa guest's RAM blocks keep their ids
    and sizes whichever host node and page pool holds them."""
    host = host_from(TWO_NODES)
    first = plan(host, numa_request(vcpus=1))
    node_of = {p.os_index: p.node for p in host.pus}
    used = {node_of[pu] for pu in first.vcpu_pus()}
    elsewhere = {p.os_index for p in host.pus if p.node not in used}
    second = plan(restricted(host, elsewhere), numa_request(vcpus=1))
    assert {r.host_nodes for r in first.memory} != {r.host_nodes for r in second.memory}
    assert abi_differences(guest_abi(first, DISK), guest_abi(second, DISK)) == []


def test_a_host_with_other_nodes_changes_the_guest_and_says_so() -> None:
    """A mirrored guest spanning all of a machine's nodes has as many guest nodes as
    the machine: planned on a machine with another node count, it is another guest."""
    assert node_count(TWO_NODES) != node_count(FOUR_NODES)
    two, four = host_from(TWO_NODES), host_from(FOUR_NODES)
    vcpus = min(len(two.pus), len(four.pus))
    saved = plan(two, numa_request(vcpus))
    here = plan(four, numa_request(vcpus))
    assert len(saved.guest_nodes) == node_count(TWO_NODES)
    assert len(here.guest_nodes) == node_count(FOUR_NODES)
    differences = abi_differences(guest_abi(saved, DISK), guest_abi(here, DISK))
    assert any(d.startswith("guest NUMA nodes:") for d in differences), differences
    assert all("host" not in d.split(":")[0] for d in differences)  # guest fields only


def test_a_flat_guest_on_huge_pages_has_another_ram_block() -> None:
    """Plain RAM is QEMU's default block; huge pages need a named backend: a state
    saved from one does not load into the other, so the ABI must tell them apart."""
    host = host_from(TWO_NODES)
    plain = plan(host, PlanRequest(profile="pinned", vcpus=1, memory_bytes=512 * MIB, accel="tcg"))
    huge = plan(
        host, PlanRequest(profile="hugepages", vcpus=1, memory_bytes=512 * MIB, accel="tcg")
    )
    differences = abi_differences(guest_abi(plain, DISK), guest_abi(huge, DISK))
    assert any(d.startswith("RAM blocks:") for d in differences), differences


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"vcpus": 3}, "vCPUs"),
        ({"memory_bytes": 4 * GIB}, "memory"),
        ({"accel": "kvm"}, "accelerator"),
    ],
)
def test_a_different_request_is_a_different_guest(change: dict[str, object], field: str) -> None:
    host = host_from(TWO_NODES)
    saved = plan(host, numa_request())
    request = numa_request().model_copy(update=change)
    if "accel" in change:
        host = host.model_copy(update={"kvm": host.kvm.model_copy(update={"usable": True})})
    here = plan(host, request)
    differences = abi_differences(guest_abi(saved, DISK), guest_abi(here, DISK))
    assert any(d.startswith(f"{field}:") for d in differences), differences


def test_devices_are_guest_side_and_paths_are_not(tmp_path: Path) -> None:
    saved_plan = plan(host_from(TWO_NODES), numa_request())
    moved = BootSpec(
        disk_image=str(tmp_path / "elsewhere.qcow2"),
        seed_image=str(tmp_path / "s.iso"),
        agent_socket="/other/agent.sock",
        qmp_socket="/other/qmp.sock",
    )
    assert abi_differences(guest_abi(saved_plan, DISK), guest_abi(saved_plan, moved)) == []
    no_seed = DISK.model_copy(update={"seed_image": None})
    assert [d.split(":")[0] for d in _diff(saved_plan, DISK, no_seed)] == ["devices"]


def test_a_nic_with_another_mac_is_another_device() -> None:
    saved_plan = plan(host_from(TWO_NODES), numa_request())
    nic = Nic(kind="bridge", source="br0", mac="52:54:00:00:00:01", ifname="hvx", mtu=1500)
    # the default wiring renders no netdev (a VF): give it a tap's
    wired = nic.model_copy(update={"wiring": nic.wiring.model_copy(update={"netdev": "tap"})})
    one = DISK.model_copy(update={"nics": (wired,)})
    other = DISK.model_copy(
        update={"nics": (wired.model_copy(update={"mac": "52:54:00:00:00:02"}),)}
    )
    (difference,) = _diff(saved_plan, one, other)
    assert difference.startswith("devices:") and "52:54:00:00:00:02" in difference


def _diff(plan_: VMPlan, a: BootSpec, b: BootSpec) -> list[str]:
    return abi_differences(guest_abi(plan_, a), guest_abi(plan_, b))
