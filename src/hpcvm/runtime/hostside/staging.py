"""The built-in guest's read-only shares as one 9p export (QEMU backend, hpcvm as root).

A guest that mounts five 9p shares, each under its own overlay, boots measurably slower
under TCG than one that mounts a single export (docs/running.md: about 4 %). So the
QEMU backend serves the same share list as one tree: QEMU starts in a private mount
namespace of its own (``unshare --mount --propagation private``, which then ``exec``\\ s
a shell that ``exec``\\ s QEMU: one pid throughout), where a tmpfs mounted on an empty
directory of the VM's run directory receives the guest's root links and, at each
read-only share's guest path, a read-only bind mount of its host directory (recursive,
so what is mounted inside it natively is there too). QEMU exports
that tmpfs (``multidevs=remap`` keeps the inode numbers of the several file systems
apart) and the guest mounts it as its root, under one overlay, with ``/etc``'s secrets
whited out there as before. ``:rw`` shares stay separate 9p devices mounted on top.

What the guest can reach is the same list: the tree holds nothing but the shares, and
QEMU still reads it as its unprivileged user. The mounts exist only in QEMU's
namespace and vanish with it: the host's mount table never sees them, and the run
directory holds one empty directory, so removing it can never reach into a host
directory through a bind mount.

The list is kept as it is (several shares) where a tree cannot express it: with the
libvirt backend (libvirt starts QEMU), without root (no mount namespace), for a disk
image (no share table), and when a read-only share lies inside another share or under
a root link (its mount point would have to be made inside a host directory).
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcvm.bootspec import BootSpec, Share

STAGE_DIR = "stage"  # in the VM's run directory: the tmpfs's mount point, empty on the host
STAGED_TAG = "hpcvm-root"


@dataclass(frozen=True)
class Staged:
    """What QEMU starts with instead of the list: the boot spec naming the one export,
    and the shell script that assembles it in QEMU's namespace."""

    boot: BootSpec
    script: str


def stage(boot: BootSpec, run_dir: Path) -> Staged | None:
    """The one-export form of ``boot``'s share list, or None where the list stays (module
    doc). Makes the empty mount point in ``run_dir``."""
    unshare = shutil.which("unshare")
    ro = [s for s in boot.shares if not s.writable]
    if not boot.share_table or not ro or os.geteuid() != 0 or unshare is None:
        return None
    if not _expressible(boot, ro):
        return None
    where = run_dir / STAGE_DIR
    where.mkdir(mode=0o755, exist_ok=True)
    hide = tuple(f"{_rel(s.guest_path)}/{h}" for s in ro for h in s.hide)
    root = Share(host_path=str(where), guest_path="/", tag=STAGED_TAG, hide=hide)
    staged = boot.model_copy(
        update={"shares": (root, *(s for s in boot.shares if s.writable)), "links": ()}
    )
    return Staged(staged, _script(boot, ro, str(where)))


def wrap(argv: Sequence[str], staged: Staged) -> list[str]:
    """``argv`` (QEMU's) started in a private mount namespace after ``staged.script``."""
    return [
        "unshare", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", staged.script, "hpcvm-stage", *argv,
    ]  # fmt: skip


def _expressible(boot: BootSpec, ro: Sequence[Share]) -> bool:
    """Whether every read-only share's mount point can be made in the tmpfs: none lies
    inside another share or under a root link."""
    others = [s.guest_path for s in boot.shares] + [link.guest_path for link in boot.links]
    return not any(
        _within(share.guest_path, other) and share.guest_path != other
        for share in ro
        for other in others
    )


def _script(boot: BootSpec, ro: Sequence[Share], where: str) -> str:
    """Mount the tmpfs, make the links and mount points, bind each share read-only;
    then become QEMU (``exec "$@"``). Any failure ends the shell, so QEMU never starts
    on a half-made tree."""
    q = shlex.quote
    lines = ["set -eu", "umask 022", f"mount -t tmpfs -o mode=0755 hpcvm-stage {q(where)}"]
    for link in boot.links:
        lines.append(f"ln -s {q(link.target)} {q(where + link.guest_path)}")
    for share in sorted(ro, key=lambda s: s.guest_path):
        target = q(where + share.guest_path)
        lines += [f"mkdir -p {target}", f"mount -o rbind,ro {q(share.host_path)} {target}"]
    lines.append('exec "$@"')
    return "\n".join(lines) + "\n"


def _rel(guest_path: str) -> str:
    return guest_path.strip("/")


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")
