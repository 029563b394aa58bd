"""Who QEMU runs as, and what that user may reach.

QEMU never runs as root. With the QEMU backend, when hpcvm runs as root, QEMU drops
to the system user ``hpcvm-qemu`` (made by scripts/setup.sh) with ``-runas``, so that it
opens what needs root first (hugetlbfs files, /dev/kvm, VFIO groups, its sockets, the
roots of the 9p shares); when hpcvm runs as another user, QEMU simply runs as that
user. The libvirt backend keeps libvirt's own DAC user (qemu.conf ``user``/``group``,
read back from libvirt's capabilities) and refuses to start a guest if that is root.
Either way the guest reaches through its shares only what that user may read, so no
share can expose a file only root may read.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpcvm.errors import UsageError

QEMU_USER = "hpcvm-qemu"


@dataclass(frozen=True)
class QemuUser:
    """The identity QEMU runs under."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups QEMU runs with
    switch: bool  # QEMU runs as another user than hpcvm (-runas, libvirt's DAC user)


def user_by_ids(uid: int, gid: int, *, switch: bool) -> QemuUser:
    """The user with ``uid`` (its name and supplementary groups from the user database)."""
    try:
        name = pwd.getpwuid(uid).pw_name
        groups = tuple(os.getgrouplist(name, gid))
    except KeyError:
        name, groups = str(uid), (gid,)
    return QemuUser(name, uid, gid, groups, switch=switch)


def qemu_user() -> QemuUser:
    """``hpcvm-qemu`` when hpcvm runs as root; the calling user otherwise.

    A missing ``hpcvm-qemu`` is a usage error before anything starts: running QEMU as
    root instead would give every guest the host's secrets.
    """
    if os.geteuid() != 0:
        return user_by_ids(os.geteuid(), os.getegid(), switch=False)
    try:
        entry = pwd.getpwnam(QEMU_USER)
    except KeyError:
        raise UsageError(
            f"the system user {QEMU_USER} that QEMU runs as does not exist: run "
            f"scripts/setup.sh, or `useradd --system --user-group --no-create-home "
            f"--shell /usr/sbin/nologin {QEMU_USER}`"
        ) from None
    if entry.pw_uid == 0:
        raise UsageError(f"the system user {QEMU_USER} has uid 0: give it its own uid")
    return user_by_ids(entry.pw_uid, entry.pw_gid, switch=True)


def can_access(path: str, user: QemuUser, *, write: bool, opened_by_root: bool) -> bool:
    """Whether ``user`` may list (and with ``write``, write into) the directory ``path``.

    Asked of the kernel as that user (``test`` run with its uid, gid and supplementary
    groups), so ACLs count. ``opened_by_root``: QEMU gets the directory already open
    (``-runas``: the export is opened before QEMU drops to ``user``), so the path's
    parents need not be searchable by ``user``; the check then goes through the open
    directory (``/proc/self/fd``) instead of the path.
    """
    want = ["-r", "-x"] + (["-w"] if write else [])
    if not user.switch:
        mode = os.R_OK | os.X_OK | (os.W_OK if write else 0)
        return os.access(path, mode)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY) if opened_by_root else None
    target = f"/proc/self/fd/{fd}" if fd is not None else path
    script = " && ".join(f'test {flag} "$1"' for flag in want)
    try:
        proc = subprocess.run(
            ["/bin/sh", "-c", script, "sh", target],
            user=user.uid,
            group=user.gid,
            extra_groups=list(user.groups),
            pass_fds=(fd,) if fd is not None else (),
            cwd="/",
            capture_output=True,
            check=False,
        )
    finally:
        if fd is not None:
            os.close(fd)
    return proc.returncode == 0


def can_search(path: str, user: QemuUser) -> bool:
    """Whether ``user`` can reach entries of the directory ``path`` by name (search
    permission on it and every parent), asked of the kernel as that user."""
    if not user.switch:
        return os.access(path, os.X_OK)
    proc = subprocess.run(
        ["/bin/sh", "-c", 'test -x "$1"', "sh", path],
        user=user.uid,
        group=user.gid,
        extra_groups=list(user.groups),
        cwd="/",
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def blocking_parent(path: str, user: QemuUser) -> str:
    """The first directory on the way to ``path`` that ``user`` cannot search."""
    parts = Path(path).parts
    for depth in range(1, len(parts) + 1):
        step = str(Path(*parts[:depth]))
        if not can_search(step, user):
            return step
    return path


def describe_mode(path: str) -> str:
    """``root 0700`` (owner and mode) for an error message."""
    try:
        st = Path(path).stat()
    except OSError:
        return "not readable"
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    return f"{owner} {st.st_mode & 0o7777:04o}"
