"""discover() on every real machine snapshot: structural invariants, and counts that
agree with hwloc's own text output (``lstopo-no-graphics --only ...``) run on the same
source, an answer that does not go through hpcvm's parser."""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from hpcvm.host import HostTopology, discover
from tests.conftest import Snapshot

_P_INDEX = re.compile(r"\(P#(\d+)")


def _discover(snap: Snapshot) -> HostTopology:
    if snap.kind == "sysfs":
        return discover(sysfs_root=snap.path)
    return discover(xml=snap.path)


def lstopo_only(snap: Snapshot, what: str) -> list[str]:
    """Lines of ``lstopo-no-graphics --only WHAT`` on the snapshot (disallowed objects
    included, GPU memory nodes kept)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLOC_")}
    env["HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES"] = "1"
    args = ["lstopo-no-graphics", "--only", what, "--disallowed"]
    if snap.kind == "sysfs":
        env["HWLOC_FSROOT"] = str(snap.path)
    else:
        args += ["-i", str(snap.path)]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True, timeout=300)
    return [line for line in out.stdout.splitlines() if line.strip()]


def os_indexes(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := _P_INDEX.search(line))]


@pytest.fixture
def host(snapshot: Snapshot) -> HostTopology:
    return _discover(snapshot)


def test_pu_os_indexes_unique_and_sorted(host: HostTopology) -> None:
    indexes = [p.os_index for p in host.pus]
    assert len(indexes) == len(set(indexes))
    assert indexes == sorted(indexes)
    assert indexes, "a host without PUs must be refused, not returned"


def test_every_pu_in_exactly_one_core_and_core_lists_match(host: HostTopology) -> None:
    in_cores = Counter(pu for core in host.cores for pu in core.pus)
    assert set(in_cores) == {p.os_index for p in host.pus}
    assert all(count == 1 for count in in_cores.values())
    for pu in host.pus:
        core = host.cores[pu.core]
        assert pu.os_index in core.pus
        assert core.node == host.pu(core.pus[0]).node
    for i, core in enumerate(host.cores):
        assert core.index == i
        assert list(core.pus) == sorted(core.pus)


def test_node_pus_partition_the_pus(host: HostTopology) -> None:
    in_nodes = Counter(pu for node in host.nodes for pu in node.pus)
    assert set(in_nodes) == {p.os_index for p in host.pus}
    assert all(count == 1 for count in in_nodes.values())
    for pu in host.pus:
        assert pu.os_index in host.node(pu.node).pus


def test_memory_only_nodes_have_no_pus(host: HostTopology) -> None:
    for node in host.nodes:
        if node.kind == "memory-only":
            assert node.pus == ()
    assert any(n.kind == "normal" for n in host.nodes)


def test_distance_matrix_square_and_local_smallest(host: HostTopology) -> None:
    n = len(host.nodes)
    assert len(host.distances) == n
    for i, row in enumerate(host.distances):
        assert len(row) == n
        assert row[i] == min(row), f"row {i}: local distance is not the smallest"
    for i in range(n):
        for j in range(n):
            # hwloc snapshots may be asymmetric; both directions must be positive
            assert host.distances[i][j] > 0


def test_nodes_sorted_and_packages_refer_to_known_nodes(host: HostTopology) -> None:
    order = [n.os_index for n in host.nodes]
    assert order == sorted(order)
    for package in host.packages:
        assert set(package.nodes) <= set(order)
    packages = {p.os_index for p in host.packages} | {-1}
    assert {pu.package for pu in host.pus} <= packages


def test_online_pus_agree_with_hwloc(snapshot: Snapshot, host: HostTopology) -> None:
    expected = sorted(os_indexes(lstopo_only(snapshot, "pu")))
    assert [p.os_index for p in host.pus if p.online] == expected


def test_core_count_agrees_with_hwloc(snapshot: Snapshot, host: HostTopology) -> None:
    expected = len(lstopo_only(snapshot, "core")) or len(lstopo_only(snapshot, "pu"))
    assert len([c for c in host.cores if any(host.pu(p).online for p in c.pus)]) == expected


def test_nodes_agree_with_hwloc(snapshot: Snapshot, host: HostTopology) -> None:
    expected = sorted(os_indexes(lstopo_only(snapshot, "numa")))
    assert [n.os_index for n in host.nodes] == expected


def test_package_count_agrees_with_hwloc(snapshot: Snapshot, host: HostTopology) -> None:
    assert len(host.packages) == len(lstopo_only(snapshot, "package"))


def test_nodes_match_sysfs_node_folders(snapshot: Snapshot, host: HostTopology) -> None:
    """Sparse numbering kept: the node numbers are the kernel's nodeN folders."""
    if snapshot.kind != "sysfs":
        pytest.skip("XML sources have no sysfs")
    base = snapshot.path / "sys" / "devices" / "system" / "node"
    if not base.is_dir():
        pytest.skip("snapshot of a kernel without NUMA: one implicit node")
    folders = sorted(
        int(p.name[4:])
        for p in base.iterdir()
        if p.name.startswith("node") and p.name[4:].isdigit()
    )
    assert [n.os_index for n in host.nodes] == folders


def test_json_round_trip(host: HostTopology) -> None:
    again = HostTopology.model_validate_json(host.model_dump_json())
    assert again == host


def test_snapshot_source_is_labelled(snapshot: Snapshot, host: HostTopology) -> None:
    assert host.source == f"{snapshot.kind}:{Path(snapshot.path).resolve()}"
    assert host.kvm.device is None and host.kvm.usable is False
    assert host.hugetlbfs_mounts == {}
