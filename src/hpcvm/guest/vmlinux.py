"""The uncompressed kernel inside a bzImage, for booting through PVH.

Under TCG, the bzImage's own decompressor (xz for Debian) runs emulated, before the
kernel's clock even starts: measured here it cost several seconds per boot on a loaded
2-core machine (the agent answered ~35% sooner with the uncompressed kernel). QEMU
boots an uncompressed ELF ``vmlinux`` directly through its PVH entry point when the
kernel has one (``CONFIG_PVH=y``, a Xen ELF note XEN_ELFNOTE_PHYS32_ENTRY, in Debian's
and most distributions' kernels), skipping decompression and real mode. ACPI tables,
and with them the NUMA topology (SRAT/SLIT), reach the guest as with a bzImage.

The bzImage setup header says where the compressed payload is (``payload_offset`` and
``payload_length`` at 0x248/0x24C, relative to the end of the setup sectors); the
payload's magic says its compression.
"""

from __future__ import annotations

import bz2
import lzma
import subprocess
import zlib
from pathlib import Path

_XEN_ELFNOTE_PHYS32_ENTRY = 18
_PT_NOTE = 4


def _decompress(payload: bytes) -> bytes | None:
    """The payload decompressed, or None for a format we cannot undo (lz4, lzo)."""
    try:
        if payload.startswith(b"\xfd7zXZ\x00"):
            # Decompressors stop at the end of their stream: padding after it is ignored.
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
        if payload.startswith(b"\x1f\x8b"):
            return zlib.decompressobj(wbits=31).decompress(payload)
        if payload.startswith(b"\x28\xb5\x2f\xfd"):
            proc = subprocess.run(["zstd", "-dc"], input=payload, capture_output=True, check=False)
            return proc.stdout if proc.returncode == 0 else None
        if payload.startswith(b"\x5d\x00"):
            return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(payload)
        if payload.startswith(b"BZh"):
            return bz2.BZ2Decompressor().decompress(payload)
    except (OSError, EOFError, lzma.LZMAError, zlib.error):
        return None
    return None


def has_pvh_entry(elf: bytes) -> bool:
    """True for an ELF64 kernel with a Xen PHYS32_ENTRY note (QEMU's PVH boot)."""
    if len(elf) < 64 or elf[:4] != b"\x7fELF" or elf[4] != 2:
        return False
    phoff = int.from_bytes(elf[0x20:0x28], "little")
    phentsize = int.from_bytes(elf[0x36:0x38], "little")
    phnum = int.from_bytes(elf[0x38:0x3A], "little")
    for i in range(phnum):
        ph = elf[phoff + i * phentsize : phoff + (i + 1) * phentsize]
        if int.from_bytes(ph[0:4], "little") != _PT_NOTE:
            continue
        offset = int.from_bytes(ph[8:16], "little")
        size = int.from_bytes(ph[32:40], "little")
        if _notes_have_pvh(elf[offset : offset + size]):
            return True
    return False


def _notes_have_pvh(notes: bytes) -> bool:
    pos = 0
    while pos + 12 <= len(notes):
        namesz = int.from_bytes(notes[pos : pos + 4], "little")
        descsz = int.from_bytes(notes[pos + 4 : pos + 8], "little")
        kind = int.from_bytes(notes[pos + 8 : pos + 12], "little")
        name = notes[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
        if name == b"Xen" and kind == _XEN_ELFNOTE_PHYS32_ENTRY:
            return True
        pos += 12 + _align4(namesz) + _align4(descsz)
    return False


def _align4(n: int) -> int:
    return (n + 3) & ~3


def extract_pvh_vmlinux(bzimage: Path) -> bytes | None:
    """The ELF kernel inside ``bzimage`` when it can boot through PVH, else None (the
    caller then boots the bzImage itself)."""
    data = bzimage.read_bytes()
    if len(data) < 0x250 or data[0x202:0x206] != b"HdrS":
        return None
    setup_sects = data[0x1F1] or 4
    start = (setup_sects + 1) * 512 + int.from_bytes(data[0x248:0x24C], "little")
    length = int.from_bytes(data[0x24C:0x250], "little")
    elf = _decompress(data[start : start + length])
    if elf is None or not has_pvh_entry(elf):
        return None
    return elf
