"""A tap in a bridge for a user who is not root: QEMU's own bridge helper, the grant an
admin makes once per node (as libvirt's session mode uses it).

``/usr/lib/qemu/qemu-bridge-helper`` is a small setuid-root program shipped with QEMU:
it creates a tap, checks the bridge against the admin's ACL (``/etc/qemu/bridge.conf``:
``allow br0``), gives the tap the bridge's MTU and a MAC starting ``fe`` (so the bridge
never adopts it), puts it into the bridge, brings it up and hands its descriptor back
over a Unix socket. QEMU could run it itself (``-netdev bridge``), but only by
spawning a process, which its seccomp sandbox denies; so hpcvm runs it just before
QEMU starts and passes the descriptor on (``-netdev tap,fd=N``), as it does for a
macvtap. The tap is not persistent: it goes when the last descriptor closes, that is
with QEMU, however QEMU ends.

An admin grants it once per node (``scripts/install-node.sh`` does both; docs/site.md):

    dpkg-statoverride --update --add root root 4755 /usr/lib/qemu/qemu-bridge-helper
    echo "allow br0" >> /etc/qemu/bridge.conf

Everything missing is refused before anything starts, naming that fix.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import struct
import subprocess
from pathlib import Path

from hpcvm.errors import RuntimeFailure, UsageError

HELPER = Path(os.environ.get("HPCVM_BRIDGE_HELPER", "/usr/lib/qemu/qemu-bridge-helper"))
ACL = Path("/etc/qemu/bridge.conf")
TUNGETIFF = 0x800454D2  # _IOR('T', 210, unsigned int): the tap's name and flags
IFREQ_SIZE = 40
HELPER_TIMEOUT = 30.0
GRANT = (
    "an admin grants it once per node: dpkg-statoverride --update --add root root 4755 "
    f"{HELPER} and echo 'allow {{bridge}}' >> {ACL} (scripts/install-node.sh; docs/site.md)"
)


def check_grant(bridge: str) -> None:
    """Refuse, naming the admin's fix, when a user cannot get a tap in ``bridge``: no
    helper, a helper that is not setuid root, or an ACL (when this user may read it)
    that does not allow the bridge."""
    grant = GRANT.format(bridge=bridge)
    try:
        info = HELPER.stat()
    except OSError:
        raise UsageError(
            f"--network bridge={bridge} as a user needs QEMU's bridge helper {HELPER}, which "
            f"is missing (package qemu-system-common): {grant}"
        ) from None
    if not (info.st_mode & stat.S_ISUID and info.st_uid == 0):
        raise UsageError(
            f"--network bridge={bridge} as a user needs QEMU's bridge helper setuid root, "
            f"and {HELPER} is not: {grant}"
        )
    allowed = acl_allows(bridge)
    if allowed is False:
        raise UsageError(f"--network bridge={bridge}: {ACL} does not allow {bridge}: {grant}")


def acl_allows(bridge: str, path: Path = ACL) -> bool | None:
    """Whether the helper's ACL allows ``bridge`` (the helper's rules: ``allow NAME``,
    ``allow all``, ``deny NAME``, ``deny all``, deny wins, ``include FILE``); None when
    this user cannot read it (the helper, root, will judge)."""
    allowed, denied = False, False
    try:
        files = [path]
        seen: set[Path] = set()
        while files:
            current = files.pop()
            if current in seen:
                continue
            seen.add(current)
            for line in current.read_text().splitlines():
                word, _, arg = line.strip().partition(" ")
                arg = arg.strip()
                if word == "include":
                    files.append(Path(arg))
                elif word == "allow" and arg in ("all", bridge):
                    allowed = True
                elif word == "deny" and arg in ("all", bridge):
                    denied = True
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return allowed and not denied


def open_tap(bridge: str) -> tuple[int, str]:
    """Run the helper for ``bridge``; the tap's descriptor (ours to pass to QEMU) and its
    name. RuntimeFailure with the helper's own words (and the grant) when it refuses."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        ours.settimeout(HELPER_TIMEOUT)
        argv = [str(HELPER), "--use-vnet", f"--br={bridge}", f"--fd={theirs.fileno()}"]
        try:
            done = subprocess.run(
                argv, pass_fds=[theirs.fileno()], capture_output=True, text=True,
                timeout=HELPER_TIMEOUT, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeFailure(f"QEMU's bridge helper failed to run: {exc}") from None
        theirs.close()
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise RuntimeFailure(
                f"QEMU's bridge helper refused a tap in {bridge}: {said}; "
                + GRANT.format(bridge=bridge)
            )
        _msg, fds, _flags, _addr = socket.recv_fds(ours, 1, 1)
    finally:
        ours.close()
        theirs.close()
    if not fds:
        raise RuntimeFailure(f"QEMU's bridge helper made no tap in {bridge}")
    return fds[0], tap_name(fds[0])


def tap_name(fd: int) -> str:
    """The name the kernel gave the tap behind ``fd`` (``TUNGETIFF``)."""
    raw = fcntl.ioctl(fd, TUNGETIFF, bytes(IFREQ_SIZE))
    name: bytes = struct.unpack("16s", raw[:16])[0]
    return name.rstrip(b"\0").decode()
