"""The initramfs: a gzip'd cpio "newc" archive written here, byte for byte.

Writing the archive in Python (instead of running ``cpio`` as root over a staging
directory) lets it hold a ``/dev/console`` device node without privileges, makes it
reproducible (owner root, time 0, fixed order), and keeps the build free of temporary
trees. The format is the kernel's (Documentation/driver-api/early-userspace/
buffer-format.rst): a 110-byte ASCII header, the NUL-terminated name padded to 4 bytes,
the data padded to 4 bytes, and a ``TRAILER!!!`` entry.
"""

from __future__ import annotations

import gzip
import lzma
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcvm.errors import RuntimeFailure
from hpcvm.guest import scripts

NEWC_MAGIC = b"070701"
TRAILER = "TRAILER!!!"
_HEADER_LEN = 110

# Directories the scripts mount on or write into.
_DIRS = ("bin", "dev", "proc", "sys", "mnt", "mnt/9p", "mnt/rw", "newroot", "lib")


@dataclass(frozen=True)
class Entry:
    """One archive member. ``data`` is a symlink's target for symlinks."""

    name: str
    mode: int  # file type and permission bits, as in st_mode
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)  # (major, minor) for device nodes


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


def write_newc(entries: list[Entry]) -> bytes:
    """The uncompressed archive: owner 0:0, mtime 0, inode numbers in order."""
    out = bytearray()
    for ino, entry in enumerate([*entries, Entry(TRAILER, 0)], start=1):
        name = entry.name.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(entry.mode) else 1
        fields = (
            ino if entry.name != TRAILER else 0,
            entry.mode,
            0,  # uid
            0,  # gid
            nlink if entry.name != TRAILER else 1,
            0,  # mtime
            len(entry.data),
            0,  # dev major
            0,  # dev minor
            entry.rdev[0],
            entry.rdev[1],
            len(name),
            0,  # check (newc: always 0)
        )
        out += NEWC_MAGIC + b"".join(b"%08X" % f for f in fields)
        out += name + _pad4(_HEADER_LEN + len(name))
        out += entry.data + _pad4(len(entry.data))
    return bytes(out)


def read_newc(archive: bytes) -> list[Entry]:
    """Parse an uncompressed newc archive (for tests and ``hpcvm guest info``)."""
    entries: list[Entry] = []
    pos = 0
    while True:
        header = archive[pos : pos + _HEADER_LEN]
        if len(header) < _HEADER_LEN or header[:6] != NEWC_MAGIC:
            raise RuntimeFailure(f"not a newc cpio archive at byte {pos}")
        fields = [int(header[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        mode, filesize, rmajor, rminor, namesize = (
            fields[1],
            fields[6],
            fields[9],
            fields[10],
            fields[11],
        )
        pos += _HEADER_LEN
        name = archive[pos : pos + namesize - 1].decode()
        pos += namesize + len(_pad4(_HEADER_LEN + namesize))
        if name == TRAILER:
            return entries
        data = archive[pos : pos + filesize]
        pos += filesize + len(_pad4(filesize))
        entries.append(Entry(name, mode, data, (rmajor, rminor)))


def read_initrd(path: Path) -> list[Entry]:
    """Members of a gzip-compressed initramfs file."""
    return read_newc(gzip.decompress(path.read_bytes()))


def _dir(name: str) -> Entry:
    return Entry(name, stat.S_IFDIR | 0o755)


def _file(name: str, data: bytes, executable: bool = False) -> Entry:
    return Entry(name, stat.S_IFREG | (0o755 if executable else 0o644), data)


def _symlink(name: str, target: str) -> Entry:
    return Entry(name, stat.S_IFLNK | 0o777, target.encode())


def module_bytes(path: Path) -> bytes:
    """A module file's contents, decompressed: busybox insmod loads plain .ko only."""
    raw = path.read_bytes()
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(raw)
    if path.name.endswith(".ko.gz"):
        return gzip.decompress(raw)
    if path.name.endswith(".ko.zst"):
        proc = subprocess.run(["zstd", "-dc"], input=raw, capture_output=True, check=False)
        if proc.returncode != 0:
            raise RuntimeFailure(f"cannot decompress {path} (is zstd installed?)")
        return proc.stdout
    return raw


def build_entries(
    busybox: Path,
    modules: list[tuple[str, Path]],
    devices: Mapping[str, tuple[str, ...]] | None = None,
) -> list[Entry]:
    """The archive's members: busybox, the modules with their load order, the scripts.

    ``modules`` is (name, file) in load order; ``devices`` gives a device module's alias
    patterns (modules.py ``load_plan``), written after its name in the order file:
    /init loads it only when a device matches one.
    """
    devices = devices or {}
    entries = [_dir(d) for d in _DIRS]
    entries.append(Entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)))
    entries.append(_file("bin/busybox", busybox.read_bytes(), executable=True))
    entries.append(_symlink("bin/sh", "busybox"))
    entries.append(_dir(scripts.MODULES_DIR))
    order: list[str] = []
    for name, path in modules:
        filename = f"{name}.ko"
        entries.append(_file(f"{scripts.MODULES_DIR}/{filename}", module_bytes(path)))
        order.append(" ".join((filename, *devices.get(name, ()))))
    entries.append(_file(scripts.MODULE_ORDER_FILE, "".join(f"{f}\n" for f in order).encode()))
    entries.append(_dir(scripts.STAGE2_DIR))
    for name, (text, executable) in scripts.FILES.items():
        entries.append(_file(name, text.encode(), executable))
    return entries


def write_initrd(entries: list[Entry], dest: Path) -> int:
    """Write the gzip'd archive to ``dest``; its size in bytes.

    gzip (level 6, mtime 0) rather than zstd: every distribution kernel unpacks it,
    Python writes it with no extra tool, and at ~2 MB the difference in unpack time is
    a few milliseconds.
    """
    data = gzip.compress(write_newc(entries), compresslevel=6, mtime=0)
    dest.write_bytes(data)
    return len(data)
