"""hugetlbfs helpers (runtime/hostside/hugetlbfs.py) against this host's real mounts and pools."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcvm.runtime.hostside import hugetlbfs


def test_default_page_size_matches_meminfo() -> None:
    text = Path("/proc/meminfo").read_text()
    kb = next(int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("Hugepagesize"))
    assert hugetlbfs.default_page_size() == kb * 1024


def _findmnt() -> list[str]:
    out = subprocess.run(
        ["findmnt", "-n", "-l", "-t", "hugetlbfs", "-o", "TARGET"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    return sorted(out)


def test_mounts_match_findmnt() -> None:
    """Other tests (another xdist worker's among them) mount and unmount hugetlbfs
    meanwhile: a comparison counts when findmnt saw the same mounts before and after."""
    for _ in range(5):
        before = _findmnt()
        ours = sorted(hugetlbfs.mounts())
        if _findmnt() == before:
            assert ours == before
            return
    pytest.fail("the hugetlbfs mounts changed during each of 5 reads")


def test_pool_counts_match_sysfs() -> None:
    total, free = hugetlbfs.pool_counts(2 * 1024 * 1024)
    base = Path("/sys/kernel/mm/hugepages/hugepages-2048kB")
    assert total == int((base / "nr_hugepages").read_text())
    assert 0 <= free <= total


def test_remove_vm_dir_only_touches_hpcvm_dirs(tmp_path: Path) -> None:
    other = tmp_path / "not-ours"
    other.mkdir()
    (other / "f").write_text("x")
    hugetlbfs.remove_vm_dir(other)
    assert (other / "f").exists()
    ours = tmp_path / "hpcvm-job1-abc"
    ours.mkdir()
    (ours / "qemu_back_mem.x").write_text("x")
    hugetlbfs.remove_vm_dir(ours)
    assert not ours.exists()


def test_missing_page_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no 64K huge pages"):
        hugetlbfs.ensure_mount(str(tmp_path / "m"), 64 * 1024)
    assert not (tmp_path / "m").exists()
