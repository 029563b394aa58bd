"""Specific facts of specific machines, each checked against the snapshot's own raw
files (sysfs text, the XML file read with ElementTree, or hwloc's command-line tools),
never against numbers produced by hpcvm itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpcvm.host import HostTopology, discover
from hpcvm.units import KIB, parse_cpu_list
from tests.conftest import TOPOLOGIES, sysfs_root

XML_DIR = TOPOLOGIES / "xml"

# memoryN block folders (thousands) are not read by hwloc or hpcvm; skip them when copying
SKIP_MEMORY_BLOCKS = shutil.ignore_patterns("memory[0-9]*")


def snap(snapshots_dir: Path, name: str) -> Path:
    return sysfs_root(snapshots_dir, name)


def node_dir(root: Path, node: int) -> Path:
    return root / "sys" / "devices" / "system" / "node" / f"node{node}"


def read(path: Path) -> str:
    return path.read_text().strip()


# --------------------------------------------------------------------------- CPUs


def test_offline_cpus(snapshots_dir: Path) -> None:
    root = snap(snapshots_dir, "16em64t-4s2c2t-offlines")
    cpu_dir = root / "sys" / "devices" / "system" / "cpu"
    offline = sorted(
        int(p.name[3:])
        for p in cpu_dir.glob("cpu[0-9]*")
        if (p / "online").exists() and read(p / "online") == "0"
    )
    assert offline, "the snapshot is expected to have offline CPUs"
    host = discover(sysfs_root=root)
    assert [p.os_index for p in host.pus if not p.online] == offline
    assert all(p.os_index not in offline for p in host.usable_pus())
    assert any("offline" in w for w in host.warnings)
    # each offline CPU is still counted in its node and in a core of its own
    for cpu in offline:
        assert host.cores[host.pu(cpu).core].pus == (cpu,)


def test_cgroup_disallowed_cpus(snapshots_dir: Path) -> None:
    """The snapshot's cgroup v2 cpuset (cpuset.cpus.effective) bars CPUs from the job."""
    root = snap(snapshots_dir, "32amd64-4s2n4c-cgroup2")
    (effective,) = (root / "cgroup").rglob("cpuset.cpus.effective")
    allowed = set(parse_cpu_list(read(effective)))
    host = discover(sysfs_root=root)
    assert {p.os_index for p in host.pus if p.allowed} == allowed
    assert {p.os_index for p in host.usable_pus()} == allowed
    assert len(host.pus) > len(allowed)
    assert any("cgroup" in w for w in host.warnings)


# --------------------------------------------------------------------------- huge pages


def _sysfs_pools(root: Path, node: int) -> dict[int, tuple[int, int]]:
    pools = {}
    for d in (node_dir(root, node) / "hugepages").glob("hugepages-*kB"):
        size = int(d.name.removeprefix("hugepages-").removesuffix("kB")) * KIB
        pools[size] = (int(read(d / "nr_hugepages")), int(read(d / "free_hugepages")))
    return pools


def test_huge_page_totals_without_numa(snapshots_dir: Path) -> None:
    """A kernel without NUMA has only sys/kernel/mm/hugepages; its pools are node 0's."""
    root = snap(snapshots_dir, "2i386-2t-hugepagesizecount")
    expected = {}
    for d in (root / "sys" / "kernel" / "mm" / "hugepages").glob("hugepages-*kB"):
        size = int(d.name.removeprefix("hugepages-").removesuffix("kB")) * KIB
        expected[size] = (int(read(d / "nr_hugepages")), int(read(d / "free_hugepages")))
    assert len(expected) >= 2
    host = discover(sysfs_root=root)
    (node,) = host.nodes
    assert {p.size_bytes: (p.total, p.free) for p in node.hugepages} == expected


@pytest.mark.parametrize(
    "name", ["64amd64-4s2n4ca2co", "nvidiagpunumanodes", "40intel64-2g2n4c+pci"]
)
def test_per_node_huge_page_pools_match_sysfs(snapshots_dir: Path, name: str) -> None:
    root = snap(snapshots_dir, name)
    host = discover(sysfs_root=root)
    for node in host.nodes:
        expected = _sysfs_pools(root, node.os_index)
        assert expected, f"{name}: node{node.os_index} has no hugepages folder"
        got = {p.size_bytes: (p.total, p.free) for p in node.hugepages}
        assert got == expected
        assert all(p.free is not None for p in node.hugepages)


def test_per_node_free_counts_follow_each_node(snapshots_dir: Path, tmp_path: Path) -> None:
    """The real snapshots all have empty pools (0 total, 0 free), which cannot show a
    node mix-up; so a copy gets distinct made-up counts per node and size (a fake of
    a machine with reserved pages, which no snapshot has)."""
    root = tmp_path / "root"
    shutil.copytree(
        snap(snapshots_dir, "64amd64-4s2n4ca2co"), root, symlinks=True, ignore=SKIP_MEMORY_BLOCKS
    )
    expected: dict[int, dict[int, tuple[int, int]]] = {}
    for node_path in sorted((root / "sys" / "devices" / "system" / "node").glob("node[0-9]*")):
        node = int(node_path.name[4:])
        for d in (node_path / "hugepages").glob("hugepages-*kB"):
            total, free = 100 + 7 * node, 3 * node
            (d / "nr_hugepages").write_text(f"{total}\n")
            (d / "free_hugepages").write_text(f"{free}\n")
            size = int(d.name.removeprefix("hugepages-").removesuffix("kB")) * KIB
            expected.setdefault(node, {})[size] = (total, free)
    host = discover(sysfs_root=root)
    got = {n.os_index: {p.size_bytes: (p.total, p.free) for p in n.hugepages} for n in host.nodes}
    assert got == expected


def test_xml_huge_pages_have_unknown_free_counts() -> None:
    """An XML export records page_type totals per node, never free counts."""
    path = XML_DIR / "16intel64-manyVFs.xml"
    raw: dict[int, dict[int, int]] = {}
    for obj in ET.parse(path).iter("object"):
        if obj.get("type") == "NUMANode":
            pages = {int(p.get("size", 0)): int(p.get("count", 0)) for p in obj.iter("page_type")}
            smallest = min(pages)
            raw[int(obj.get("os_index", -1))] = {s: c for s, c in pages.items() if s != smallest}
    host = discover(xml=path)
    for node in host.nodes:
        assert {p.size_bytes: p.total for p in node.hugepages} == raw[node.os_index]
        assert all(p.free is None for p in node.hugepages)


# --------------------------------------------------------------------------- nodes


def _cpuless_nodes(root: Path) -> set[int]:
    out = set()
    for d in (root / "sys" / "devices" / "system" / "node").glob("node[0-9]*"):
        cpumap = read(d / "cpumap").replace(",", "")
        if int(cpumap, 16) == 0:
            out.add(int(d.name[4:]))
    return out


@pytest.mark.parametrize("name", ["nvidiagpunumanodes", "64intel64-fakeKNL-SNC4-hybrid"])
def test_memory_only_nodes(snapshots_dir: Path, name: str) -> None:
    root = snap(snapshots_dir, name)
    expected = _cpuless_nodes(root)
    assert expected, f"{name} is expected to have CPU-less nodes"
    host = discover(sysfs_root=root)
    assert {n.os_index for n in host.nodes if n.kind == "memory-only"} == expected
    for node in host.nodes:
        meminfo = read(node_dir(root, node.os_index) / "meminfo")
        total_kb = int(meminfo.split("MemTotal:")[1].split()[0])
        # hwloc reports MemTotal; allow for its rounding to pages
        assert abs(node.memory_bytes - total_kb * KIB) <= 64 * KIB


def test_knl_memory_side_cache_is_not_a_cpu_cache(snapshots_dir: Path) -> None:
    """hwloc shows KNL's MCDRAM cache (from the snapshot's hwloc-dump-hwdata files) as a
    memory-side cache; it must not be listed among the CPU caches."""
    root = snap(snapshots_dir, "64intel64-fakeKNL-SNC4-hybrid")
    dumped = read(root / "var" / "run" / "hwloc" / "knl_memoryside_cache")
    mcdram_cache = int(dumped.split("cache_size:")[1].split()[0])
    host = discover(sysfs_root=root)
    assert host.caches
    assert all(c.size_bytes < mcdram_cache for c in host.caches)


def test_sparse_numa_numbering(snapshots_dir: Path) -> None:
    root = snap(snapshots_dir, "nvidiagpunumanodes")
    online = parse_cpu_list(read(root / "sys" / "devices" / "system" / "node" / "online"))
    host = discover(sysfs_root=root)
    assert [n.os_index for n in host.nodes] == online
    assert online != list(range(len(online))), "the snapshot's numbering should be sparse"
    # distances are looked up by OS number, not position
    for a in online:
        row = [int(v) for v in read(node_dir(root, a) / "distance").split()]
        for b, value in zip(online, row, strict=True):
            assert host.distance(a, b) == value


def test_distances_from_kernel_when_hwloc_has_none(snapshots_dir: Path) -> None:
    """hwloc exports no distances for this KNL snapshot; the kernel's are used."""
    root = snap(snapshots_dir, "64intel64-fakeKNL-SNC4-hybrid")
    host = discover(sysfs_root=root)
    nodes = sorted(int(p.name[4:]) for p in node_dir(root, 0).parent.glob("node[0-9]*"))
    for a in nodes:
        row = [int(v) for v in read(node_dir(root, a) / "distance").split()]
        assert [host.distance(a, b) for b in nodes] == row
    assert not any("distance" in w for w in host.warnings)


def test_distances_from_xml_in_os_order() -> None:
    """16amd64-4distances.xml lists its NUMA latency matrix in the order 1 0 2 5 4 3 6 7."""
    path = XML_DIR / "16amd64-4distances.xml"
    (dist,) = [
        d
        for d in ET.parse(path).iter("distances2")
        if d.get("type") == "NUMANode" and d.get("indexing") == "os"
    ]
    indexes = [int(x) for x in (dist.findtext("indexes") or "").split()]
    values = [int(v) for el in dist.findall("u64values") for v in (el.text or "").split()]
    assert indexes != sorted(indexes)
    host = discover(xml=path)
    n = len(indexes)
    for i, a in enumerate(indexes):
        for j, b in enumerate(indexes):
            assert host.distance(a, b) == values[i * n + j]


def test_distances_split_over_several_elements() -> None:
    """192em64t-24n8c2t.xml spreads its 24 indexes and 576 values over many elements."""
    path = XML_DIR / "192em64t-24n8c2t.xml"
    (dist,) = [d for d in ET.parse(path).iter("distances2") if d.get("type") == "NUMANode"]
    indexes = [int(x) for el in dist.findall("indexes") for x in (el.text or "").split()]
    values = [int(v) for el in dist.findall("u64values") for v in (el.text or "").split()]
    assert len(dist.findall("indexes")) > 1
    host = discover(xml=path)
    n = len(indexes)
    assert len(host.nodes) == n
    for i, a in enumerate(indexes):
        for j, b in enumerate(indexes):
            assert host.distance(a, b) == values[i * n + j]
    assert not any("distance" in w for w in host.warnings)


def test_missing_distances_are_synthesized_with_a_warning() -> None:
    path = XML_DIR / "16intel64-manyVFs.xml"
    assert not [d for d in ET.parse(path).iter("distances2") if d.get("type") == "NUMANode"], (
        "this XML is expected to have no NUMA distances"
    )
    host = discover(xml=path)
    assert len(host.nodes) > 1
    for i, row in enumerate(host.distances):
        assert row[i] == 10 and all(v == 20 for j, v in enumerate(row) if j != i)
    assert any("distance" in w for w in host.warnings)


# --------------------------------------------------------------------------- PCI


def test_pci_numa_node_from_sysfs(snapshots_dir: Path) -> None:
    root = snap(snapshots_dir, "40intel64-2g2n4c+pci")
    host = discover(sysfs_root=root)
    assert host.pci
    devices = root / "sys" / "bus" / "pci" / "devices"
    for dev in host.pci:
        raw = int(read(devices / dev.bdf / "numa_node"))
        assert dev.numa_node == (raw if raw >= 0 else None)
        driver = devices / dev.bdf / "driver"
        assert dev.driver == (Path(os.readlink(driver)).name if driver.is_symlink() else None)
    assert any(d.numa_node is not None for d in host.pci)
    kinds = {d.kind for d in host.pci}
    assert {"ethernet", "infiniband"} <= kinds


def _hwloc_local_node(path: Path, bdf: str) -> int | None:
    """hwloc-info's answer for the device's local NUMA node (None if several)."""
    out = subprocess.run(
        ["hwloc-info", "-i", str(path), "--whole-io", "--local-memory", f"pci={bdf}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    nodes = [int(line.split("=")[1]) for line in out.splitlines() if line.startswith(" os index")]
    return nodes[0] if len(nodes) == 1 else None


@pytest.mark.parametrize(
    "name", ["24em64t-2n6c2t-pci", "32em64t-2n8c2t-pci-normalio", "16intel64-manyVFs"]
)
def test_pci_devices_in_xml(name: str) -> None:
    path = XML_DIR / f"{name}.xml"
    raw = [
        (o.get("pci_busid", ""), int((o.get("pci_type") or "0").split()[0], 16))
        for o in ET.parse(path).iter("object")
        if o.get("type") == "PCIDev"
    ]
    busids = [b for b, _ in raw]
    wanted = {b for b, cls in raw if cls in (0x0200, 0x0207, 0x0C06, 0x0108, 0x0302)}
    host = discover(xml=path)
    got = {d.bdf for d in host.pci}
    assert wanted <= got
    checked = 0
    for dev in host.pci:
        if busids.count(dev.bdf) != 1:
            continue  # hwloc's test file reuses a bus id; hwloc-info cannot tell them apart
        assert dev.numa_node == _hwloc_local_node(path, dev.bdf), dev.bdf
        checked += 1
    assert checked
    assert all(d.iommu_group is None for d in host.pci)
    assert host.iommu is None


def test_pci_classes() -> None:
    host = discover(xml=XML_DIR / "32em64t-2n8c2t-pci-normalio.xml")
    by_bdf = {d.bdf: d for d in host.pci}
    assert by_bdf["0000:84:00.0"].kind == "gpu"
    assert "cuda0" in by_bdf["0000:84:00.0"].os_devices
    assert by_bdf["0000:81:00.0"].kind == "ethernet"
    ib = [d for d in host.pci if d.kind == "infiniband"]
    assert ib and all("mlx5_0" in d.os_devices for d in ib)


# --------------------------------------------------------------------------- cpu


def test_cpu_model_and_flags_from_the_snapshot_not_this_host(snapshots_dir: Path) -> None:
    """hwloc's x86 backend would report THIS machine's CPUID; the snapshot's cpuinfo
    must win."""
    root = snap(snapshots_dir, "40intel64-2g2n4c+pci")
    lines = read(root / "proc" / "cpuinfo").splitlines()
    model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
    host = discover(sysfs_root=root)
    assert host.cpu_model == model
    assert host.cpu_flags == frozenset(flags)
    assert all(p.cpu_model == model for p in host.packages)
    assert host.kvm.hw_virt == ("vmx" in flags or "svm" in flags)
    assert host.kvm.usable is False and "snapshot" in host.kvm.reason


def test_xml_knows_nothing_of_kvm_thp_iommu() -> None:
    host: HostTopology = discover(xml=XML_DIR / "16em64t-4s2c2t.xml")
    assert host.kvm.device is None and host.kvm.usable is False
    assert host.thp is None and host.iommu is None and host.iommu_groups == {}
