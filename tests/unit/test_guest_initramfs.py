"""The initramfs archive: hpcvm's newc writer checked against GNU cpio, and the
members of a real guest initramfs (busybox, the modules in load order, the scripts)."""

from __future__ import annotations

import gzip
import stat
import subprocess
from pathlib import Path

import pytest

from hpcvm.guest import hosttools, scripts
from hpcvm.guest import kernel as kernels
from hpcvm.guest.initramfs import Entry, build_entries, read_initrd, read_newc, write_initrd
from hpcvm.guest.initramfs import write_newc as newc
from hpcvm.guest.modules import GUEST_MODULES, ModuleIndex
from tests.guest_support import unpacked_kernel


def _cpio_list(archive: bytes, verbose: bool = False) -> list[str]:
    """What GNU cpio (not hpcvm) reads from an uncompressed archive."""
    flags = "-itv" if verbose else "-it"
    proc = subprocess.run(
        ["cpio", flags, "--quiet"], input=archive, capture_output=True, check=True
    )
    return proc.stdout.decode().splitlines()


def test_writer_output_is_read_by_gnu_cpio(tmp_path: Path) -> None:
    entries = [
        Entry("d", stat.S_IFDIR | 0o755),
        Entry("d/file", stat.S_IFREG | 0o644, b"abc"),  # 3 bytes: padding needed
        Entry("d/exe", stat.S_IFREG | 0o755, b"#!/bin/sh\n"),
        Entry("d/link", stat.S_IFLNK | 0o777, b"file"),
        Entry("console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
    ]
    archive = newc(entries)
    assert _cpio_list(archive) == ["d", "d/file", "d/exe", "d/link", "console"]
    listing = _cpio_list(archive, verbose=True)
    assert listing[3].startswith("lrwxrwxrwx") and listing[3].endswith("d/link -> file")
    assert listing[4].startswith("crw-------") and "5,   1" in listing[4]
    # And the bytes come back out of cpio unchanged.
    subprocess.run(
        ["cpio", "-idm", "--quiet", "--no-absolute-filenames"],
        input=archive,
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "d/file").read_bytes() == b"abc"
    assert (tmp_path / "d/exe").stat().st_mode & 0o777 == 0o755
    assert read_newc(archive) == entries


def test_writer_is_reproducible() -> None:
    entries = [Entry("f", stat.S_IFREG | 0o644, b"x" * 1001)]
    assert newc(entries) == newc(entries)


def test_reader_refuses_garbage() -> None:
    from hpcvm.errors import RuntimeFailure

    with pytest.raises(RuntimeFailure, match="not a newc"):
        read_newc(b"070707" + b"0" * 200)


@pytest.fixture(scope="module")
def tree() -> kernels.KernelTree:
    return unpacked_kernel()


@pytest.fixture(scope="module")
def initrd(tree: kernels.KernelTree, tmp_path_factory: pytest.TempPathFactory) -> Path:
    index = ModuleIndex.load(tree.modules_dir)
    modules = [(n, tree.modules_dir / index.paths[n]) for n in index.load_order(GUEST_MODULES)]
    path = tmp_path_factory.mktemp("initrd") / "initrd.img"
    write_initrd(build_entries(hosttools.busybox().path, modules), path)
    return path


def test_real_initramfs_lists_what_the_init_script_needs(initrd: Path) -> None:
    names = set(_cpio_list(gzip.decompress(initrd.read_bytes())))
    expected = {
        "init",
        "bin/busybox",
        "bin/sh",
        "dev/console",
        "proc",
        "sys",
        "mnt/9p",
        "mnt/rw",
        "newroot",
        "lib/modules/order",
        "hpcvm/inittab",
        "hpcvm/rc",
        "hpcvm/agent",
        "hpcvm/shutdown",
    }
    expected |= {f"lib/modules/{m}.ko" for m in GUEST_MODULES}
    assert expected <= names


def test_modules_are_the_kernel_files_in_load_order(initrd: Path, tree: kernels.KernelTree) -> None:
    members = {e.name: e for e in read_initrd(initrd)}
    order = members["lib/modules/order"].data.decode().split()
    index = ModuleIndex.load(tree.modules_dir)
    assert order == [f"{m}.ko" for m in index.load_order(GUEST_MODULES)]
    for filename in order:
        name = filename.removesuffix(".ko")
        source = tree.modules_dir / index.paths[name]
        assert members[f"lib/modules/{filename}"].data == source.read_bytes(), name


def test_busybox_and_scripts_are_intact(initrd: Path, tmp_path: Path) -> None:
    subprocess.run(
        f"zcat {initrd} | cpio -idm --quiet --no-absolute-filenames",
        shell=True,
        cwd=tmp_path,
        check=True,
    )
    busybox = hosttools.busybox()
    assert hosttools.file_sha256(tmp_path / "bin/busybox") == busybox.sha256
    assert hosttools.is_static_elf(tmp_path / "bin/busybox")
    assert (tmp_path / "init").stat().st_mode & 0o111
    assert (tmp_path / "init").read_text() == scripts.INIT
    assert (tmp_path / "hpcvm/shutdown").read_text() == scripts.SHUTDOWN
    # The scripts parse (busybox sh -n: syntax only, nothing runs).
    for name in ("init", "hpcvm/rc", "hpcvm/agent", "hpcvm/shutdown"):
        subprocess.run([str(busybox.path), "sh", "-n", str(tmp_path / name)], check=True)
