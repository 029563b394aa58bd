"""The uncompressed PVH kernel taken out of the distribution bzImage, checked with
tools that are not hpcvm's: xz (decompression) and readelf (the PVH note)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcvm.guest import kernel as kernels
from hpcvm.guest.vmlinux import extract_pvh_vmlinux, has_pvh_entry
from tests.guest_support import unpacked_kernel

XZ_MAGIC = b"\xfd7zXZ\x00"


@pytest.fixture(scope="module")
def tree() -> kernels.KernelTree:
    return unpacked_kernel()


@pytest.fixture(scope="module")
def elf(tree: kernels.KernelTree) -> bytes:
    extracted = extract_pvh_vmlinux(tree.vmlinuz)
    assert extracted is not None, "Debian's kernel has CONFIG_PVH=y: extraction must work"
    return extracted


def test_matches_what_xz_unpacks(tree: kernels.KernelTree, elf: bytes) -> None:
    """The Linux tree's scripts/extract-vmlinux way: find the xz magic, run xz."""
    data = tree.vmlinuz.read_bytes()
    start = data.index(XZ_MAGIC)
    proc = subprocess.run(
        ["xz", "-dc", "--single-stream"], input=data[start:], capture_output=True, check=False
    )
    assert proc.stdout == elf


def test_pvh_note_is_seen_as_readelf_sees_it(elf: bytes, tmp_path: Path) -> None:
    path = tmp_path / "vmlinux"
    path.write_bytes(elf)
    notes = subprocess.run(
        ["readelf", "-n", str(path)], capture_output=True, text=True, check=True
    ).stdout
    # XEN_ELFNOTE_PHYS32_ENTRY is note type 18 (0x12) owned by "Xen".
    assert "Unknown note type: (0x00000012)" in notes or "PHYS32_ENTRY" in notes
    assert has_pvh_entry(elf)


def test_kernel_without_pvh_note_is_not_taken(elf: bytes) -> None:
    # The same ELF with its note type renamed (a kernel built without CONFIG_PVH).
    marker = (18).to_bytes(4, "little") + b"Xen\0"
    assert marker in elf
    assert not has_pvh_entry(elf.replace(marker, (99).to_bytes(4, "little") + b"Xen\0"))


def test_non_kernels_give_none(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"\0" * 8192)
    assert extract_pvh_vmlinux(junk) is None
