"""hugetlbfs mounting (runtime/hostside/hugetlbfs.py) for real: needs root."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.hostside import hugetlbfs

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root"),
]
PAGE_2M = 2 * 1024 * 1024


def _findmnt(path: Path) -> tuple[str, str]:
    out = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE,OPTIONS", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], out[1]


def test_mounts_missing_hugetlbfs_with_the_page_size(tmp_path: Path) -> None:
    target = tmp_path / "huge2m"
    hugetlbfs.ensure_mount(str(target), PAGE_2M)
    try:
        fstype, options = _findmnt(target)
        assert fstype == "hugetlbfs" and "pagesize=2M" in options
        hugetlbfs.ensure_mount(str(target), PAGE_2M)  # idempotent: already right
        assert hugetlbfs.mounts()[str(target)] == PAGE_2M
    finally:
        subprocess.run(["umount", str(target)], check=True)


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/hugepages/hugepages-1048576kB").is_dir(), reason="no 1G pages"
)
def test_mount_of_another_page_size_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "huge"
    hugetlbfs.ensure_mount(str(target), PAGE_2M)
    try:
        with pytest.raises(RuntimeFailure, match="2M pages, the plan needs 1G"):
            hugetlbfs.ensure_mount(str(target), 1024 * 1024 * 1024)
    finally:
        subprocess.run(["umount", str(target)], check=True)
