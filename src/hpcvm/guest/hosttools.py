"""The host programs the built-in guest is made of: busybox (in the initramfs) and
qemu-guest-agent (run from the shared host root). Their versions and hashes are part
of the image's cache key, so upgrading either package rebuilds the image."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcvm.errors import RuntimeFailure
from hpcvm.host.privilege import for_admin

# The guest runs the agent from the host's root at this path (see scripts.AGENT).
QEMU_GA = Path("/usr/sbin/qemu-ga")
_PT_INTERP = 3
# Installing a host package is root's to do: a user is told to ask the admin (for_admin).
_INSTALL_BUSYBOX = "install busybox-static (`apt-get install busybox-static`)"


@dataclass(frozen=True)
class HostTool:
    path: Path
    version: str
    sha256: str


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_static_elf(path: Path) -> bool:
    """True for an ELF64 executable without a program interpreter (statically linked):
    the initramfs has no libc for a dynamic one to load."""
    with path.open("rb") as fh:
        head = fh.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
            return False
        phoff = int.from_bytes(head[0x20:0x28], "little")
        phentsize = int.from_bytes(head[0x36:0x38], "little")
        phnum = int.from_bytes(head[0x38:0x3A], "little")
        fh.seek(phoff)
        table = fh.read(phentsize * phnum)
    types = (int.from_bytes(table[i : i + 4], "little") for i in range(0, len(table), phentsize))
    return _PT_INTERP not in types


def _first_line(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0].strip() if lines else "unknown"


def busybox(candidates: Sequence[str | None] | None = None) -> HostTool:
    """The host's static busybox (Debian package busybox-static): the first of
    ``candidates`` that is a file (by default the one on PATH, then /bin's, /usr/bin's;
    a test names others)."""
    if candidates is None:
        candidates = [shutil.which("busybox"), "/bin/busybox", "/usr/bin/busybox"]
    for found in candidates:
        if found and Path(found).is_file():
            path = Path(found).resolve()
            if not is_static_elf(path):
                raise RuntimeFailure(
                    f"{path} is dynamically linked; the guest's initramfs needs a static "
                    "busybox: " + for_admin(_INSTALL_BUSYBOX)
                )
            banner = _first_line([str(path)])  # "BusyBox v1.35.0 (Debian ...) multi-call ..."
            version = banner.removeprefix("BusyBox ").split(" multi-call")[0]
            return HostTool(path, version, file_sha256(path))
    raise RuntimeFailure("busybox not found: " + for_admin(_INSTALL_BUSYBOX))


def qemu_ga(path: Path = QEMU_GA) -> HostTool:
    """The host's qemu-guest-agent, which the guest runs from the shared root (at
    ``path``: a test names another)."""
    if not path.is_file():
        raise RuntimeFailure(
            f"{path} not found: "
            + for_admin("install qemu-guest-agent (`apt-get install qemu-guest-agent`)")
        )
    version = _first_line([str(path), "--version"]).removeprefix("QEMU Guest Agent ")
    return HostTool(path, version, file_sha256(path))
