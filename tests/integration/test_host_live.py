"""discover() on this very machine (2 CPUs, one node, paravirtual KVM), checked
against what the kernel and Python say directly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcvm.cli.main import main
from hpcvm.host import HostTopology, discover
from hpcvm.units import KIB, parse_cpu_list, parse_size

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def host() -> HostTopology:
    return discover()


def _meminfo_kb(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def test_cpus_match_the_os(host: HostTopology) -> None:
    assert host.source == "live"
    assert len([p for p in host.pus if p.online]) == os.cpu_count()
    assert {p.os_index for p in host.usable_pus()} == os.sched_getaffinity(0)


def _status_list(key: str) -> set[int]:
    """A list line of /proc/self/status (the kernel's own view of this process)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return set(parse_cpu_list(line.split(":", 1)[1].strip()))
    raise KeyError(key)


def test_memory_set_and_node_membership_match_the_kernel(host: HostTopology) -> None:
    """Allowed memory nodes are the kernel's Mems_allowed_list for this process; every
    online CPU's node is the node whose cpulist names it (none when no node does)."""
    allowed = {n.os_index for n in host.nodes if n.allowed}
    assert allowed == _status_list("Mems_allowed_list") & {n.os_index for n in host.nodes}
    base = Path("/sys/devices/system/node")
    listed: dict[int, int] = {}
    for folder in base.glob("node[0-9]*"):
        for cpu in parse_cpu_list((folder / "cpulist").read_text().strip() or ""):
            listed[cpu] = int(folder.name[4:])
    for pu in host.pus:
        if pu.online:
            assert pu.node == listed.get(pu.os_index), f"CPU {pu.os_index}"
    node = host.nodes[0]
    assert node.available_bytes is not None and 0 < node.available_bytes <= node.memory_bytes


def _node_memtotal_kb(node: int) -> int:
    text = Path(f"/sys/devices/system/node/node{node}/meminfo").read_text()
    return int(text.split("MemTotal:")[1].split()[0])


def test_one_node_with_the_kernels_node_memory(host: HostTopology) -> None:
    """Node sizes are the kernel's node MemTotal, plus, when the kernel initialises
    memory lazily (this machine boots with deferred_init=lazy: the node totals grow as
    memory is touched, far below /proc/meminfo's MemTotal), the memory it has not
    initialised yet: on a host of one node, all of MemTotal. discover() says so in a
    warning."""
    online = Path("/sys/devices/system/node/online").read_text().strip()
    assert [str(n.os_index) for n in host.nodes] == online.split(",")
    total = _meminfo_kb("MemTotal") * KIB
    in_nodes = sum(_node_memtotal_kb(n.os_index) * KIB for n in host.nodes)
    lazy = in_nodes < 0.9 * total
    for node in host.nodes:
        # the node total may grow between the two reads (lazy init): allow 5%
        expected = _node_memtotal_kb(node.os_index) * KIB
        if lazy and len(host.nodes) == 1:
            expected = total
        assert abs(node.memory_bytes - expected) <= 0.05 * expected
    assert lazy == any("lazily" in w for w in host.warnings)


def test_huge_page_pools_match_sysfs(host: HostTopology) -> None:
    for node in host.nodes:
        base = Path(f"/sys/devices/system/node/node{node.os_index}/hugepages")
        expected = {
            int(d.name[len("hugepages-") : -2]) * KIB: int((d / "nr_hugepages").read_text())
            for d in base.iterdir()
        }
        assert {p.size_bytes: p.total for p in node.hugepages} == expected
        assert all(p.free is not None for p in node.hugepages)


def test_kvm_is_paravirtual_and_not_usable(host: HostTopology) -> None:
    """This machine's /dev/kvm is kvm_pvm: present, but no VT-x, so not usable."""
    assert Path("/sys/module/kvm_pvm").exists(), "test written for this PVM machine"
    flags = next(
        line.split(":", 1)[1].split()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("flags")
    )
    assert host.kvm.device is Path("/dev/kvm").exists()
    assert host.kvm.hw_virt == ("vmx" in flags or "svm" in flags)
    assert host.kvm.pvm is True
    assert host.kvm.usable is False
    assert "PVM" in host.kvm.reason.upper() and "TCG" in host.kvm.reason


def test_thp_and_iommu_from_this_host(host: HostTopology) -> None:
    enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    assert f"[{host.thp}]" in enabled
    groups = Path("/sys/kernel/iommu_groups")
    has_groups = groups.is_dir() and any(groups.iterdir())
    assert host.iommu is has_groups


def test_hugetlbfs_mounts_are_real_mounts(host: HostTopology) -> None:
    """Every page size the kernel has a hugetlbfs mount of is reported, at one of its
    mounts, and one this process may write where there is such a mount (a site's group
    mount beside root's /dev/hugepages). Oracle: /proc/mounts and access(2)."""
    default = int(_meminfo("Hugepagesize")) * 1024
    by_size: dict[int, list[str]] = {}
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] != "hugetlbfs":
            continue
        size = default
        for option in fields[3].split(","):
            if option.startswith("pagesize="):
                size = parse_size(option.removeprefix("pagesize="))
        by_size.setdefault(size, []).append(fields[1])
    assert sorted(host.hugetlbfs_mounts) == sorted(by_size)
    for size, path in host.hugetlbfs_mounts.items():
        assert path in by_size[size]
        writable = [p for p in by_size[size] if os.access(p, os.W_OK | os.X_OK)]
        if writable:
            assert path in writable, (size, path, by_size[size])


def test_cli_on_this_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["host"]) == 0
    out = capsys.readouterr().out
    assert "live" in out and "kvm_pvm" in out


def _meminfo(key: str) -> str:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return line.split()[1]
    raise AssertionError(f"no {key} in /proc/meminfo")
