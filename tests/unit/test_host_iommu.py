"""IOMMU groups read from a snapshot's sys/kernel/iommu_groups.

No snapshot records IOMMU groups and this machine has no IOMMU (no VFIO), so the
groups here are a FAKE: a copy of the real 40intel64-2g2n4c+pci snapshot to which the
test adds the kernel's layout (iommu_groups/<n>/devices/<bdf> links, and the
per-device iommu_group link) for devices that really are in the snapshot.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hpcvm.host import HostTopology, discover
from tests.conftest import sysfs_root

# group -> member BDFs (all present in the snapshot's sys/bus/pci/devices)
GROUPS = {
    3: ("0000:00:05.0", "0000:02:00.0", "0000:02:00.1"),  # bridge + dual-port NIC
    7: ("0000:03:00.0",),
    8: ("0000:03:00.1", "0000:00:1f.2"),  # NIC sharing a group with a non-bridge device
    12: ("0000:40:03.0", "0000:43:00.0"),  # bridge + InfiniBand HCA
}
WITH_DEVICE_LINK = {"0000:43:00.0", "0000:02:00.0"}  # the rest: group folders only

# memoryN block folders (thousands) are not read by hwloc or hpcvm; skip them when copying
SKIP_MEMORY_BLOCKS = shutil.ignore_patterns("memory[0-9]*")


def _add_groups(root: Path) -> None:
    pci = root / "sys" / "bus" / "pci" / "devices"
    for group, members in GROUPS.items():
        devices = root / "sys" / "kernel" / "iommu_groups" / str(group) / "devices"
        devices.mkdir(parents=True)
        for bdf in members:
            assert (pci / bdf).exists(), f"{bdf} is not in the snapshot"
            target = os.path.relpath((pci / bdf).resolve(), devices)
            (devices / bdf).symlink_to(target)
            if bdf in WITH_DEVICE_LINK:
                link = (pci / bdf).resolve() / "iommu_group"
                link.symlink_to(os.path.relpath(devices.parent, link.parent))


@pytest.fixture(scope="module")
def host(snapshots_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> HostTopology:
    root = tmp_path_factory.mktemp("iommu") / "root"
    shutil.copytree(
        sysfs_root(snapshots_dir, "40intel64-2g2n4c+pci"),
        root,
        symlinks=True,
        ignore=SKIP_MEMORY_BLOCKS,
    )
    _add_groups(root)
    return discover(sysfs_root=root)


def test_groups_and_iommu_on(host: HostTopology) -> None:
    assert host.iommu is True
    assert host.iommu_groups == {g: tuple(sorted(m)) for g, m in GROUPS.items()}


def test_devices_carry_their_group(host: HostTopology) -> None:
    group_of = {bdf: g for g, members in GROUPS.items() for bdf in members}
    by_bdf = {d.bdf: d for d in host.pci}
    for bdf in ("0000:02:00.0", "0000:02:00.1", "0000:03:00.0", "0000:03:00.1", "0000:43:00.0"):
        assert by_bdf[bdf].iommu_group == group_of[bdf]
    assert by_bdf["0000:43:00.0"].kind == "infiniband"


def test_bridges_in_groups_are_listed_as_bridges(host: HostTopology) -> None:
    by_bdf = {d.bdf: d for d in host.pci}
    for bdf in ("0000:00:05.0", "0000:40:03.0"):
        assert by_bdf[bdf].is_bridge
        assert by_bdf[bdf].kind == "other"
    # a non-bridge device of no interest stays out of `pci` but in its group, so the
    # planner can see that group 8 holds something besides the NIC
    assert "0000:00:1f.2" not in by_bdf
    assert "0000:00:1f.2" in host.iommu_groups[8]


def test_snapshot_without_groups_is_unknown(snapshots_dir: Path) -> None:
    root = sysfs_root(snapshots_dir, "40intel64-2g2n4c+pci")
    assert not (root / "sys" / "kernel" / "iommu_groups").exists()
    host = discover(sysfs_root=root)
    assert host.iommu is None
    assert host.iommu_groups == {}
    assert not any(d.is_bridge for d in host.pci)
