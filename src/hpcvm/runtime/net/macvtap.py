"""``macvtap``: a macvtap link on a parent device (the host NIC, or a VLAN or bond on
it) in bridge mode: the guest's frames leave through the parent's driver with no bridge
in between.

Unlike a tap, a macvtap link outlives the descriptor QEMU holds, so hpcvm creates it
under the VM's deterministic name just before QEMU starts, hands QEMU an open descriptor
on its character device (``-netdev tap,fd=N``), and deletes it (only a macvtap of that
name on that parent) whenever the VM is stopped, torn down or found stale. libvirt does
all of this itself (``<interface type='direct'>``).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from hpcvm.bootspec import Nic, NicWiring
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.runtime.net.base import (
    IP_TIMEOUT,
    VHOST_NET,
    NetworkRequest,
    NicFds,
    Warn,
    link,
    link_kind,
    named_link_nic,
    run_ip,
)

MACVTAP_MODE = "bridge"  # VMs on one parent reach each other without leaving the host
NOT_A_PARENT = ("bridge", "tun", "macvtap", "macvlan")
SYSFS_NET = Path("/sys/class/net")


class MacvtapKind:
    """A macvtap link on a parent device, in bridge mode (module doc). The parent must
    be a device that carries the host's traffic itself: not a bridge (use ``bridge=``)
    and not a port of one (the bridge owns its ports' frames, the kernel refuses a
    macvtap there). As with every macvtap, the host cannot reach the guest through the
    parent itself; other hosts and the parent's other macvtaps can."""

    libvirt_attaches = True  # <interface type='direct'>: libvirt makes and removes it
    privileged = True

    def resolve(
        self, request: NetworkRequest, *, vm: str, index: int, address: str | None, warn: Warn
    ) -> Nic:
        parent = request.source
        info = link(parent)
        if info is None:
            raise UsageError(
                f"--network macvtap={parent}: no interface {parent!r} in this network "
                "namespace: name the host NIC the VMs should share (`ip link` lists them)"
            )
        kind = link_kind(info)
        if kind in NOT_A_PARENT:
            raise UsageError(
                f"--network macvtap={parent}: {parent} is a {kind}, not a NIC: for a bridge "
                f"use --network bridge={parent}; else name the host NIC itself"
            )
        if info.get("link_type") != "ether":
            raise UsageError(
                f"--network macvtap={parent}: {parent} is not an Ethernet device "
                f"({info.get('link_type')}): name the host's Ethernet NIC"
            )
        if info.get("master"):
            raise UsageError(
                f"--network macvtap={parent}: {parent} is a port of {info['master']}, which "
                f"owns its frames: use --network bridge={info['master']}"
            )
        nic = named_link_nic("macvtap", request, info, vm=vm, index=index,
                                      address=address, warn=warn)  # fmt: skip
        return nic.model_copy(update={"wiring": self.wiring(nic)})

    def wiring(self, nic: Nic) -> NicWiring:
        """A tap QEMU gets as descriptors hpcvm opened (QEMU cannot open a macvtap by
        name); libvirt's ``<interface type='direct'>`` in bridge mode on the parent."""
        return NicWiring(
            netdev="tap",
            fds_from_hpcvm=True,
            libvirt_type="direct",
            libvirt_source=(("dev", nic.source), ("mode", MACVTAP_MODE)),
        )

    def open(self, nic: Nic, run_dir: Path) -> NicFds:
        """Create the link (the guest's MAC, the NIC's MTU, up) and open its character
        device; on any failure the link is removed again."""
        run_ip(
            "link", "add", "link", nic.source, "name", nic.ifname, "address", nic.mac,
            "mtu", str(nic.mtu), "type", "macvtap", "mode", MACVTAP_MODE,
        )  # fmt: skip
        fds: list[int] = []
        try:
            run_ip("link", "set", "dev", nic.ifname, "up")
            fds.append(_open_char_device(_macvtap_device(nic.ifname), run_dir / nic.ifname))
            if nic.vhost:
                fds.append(os.open(VHOST_NET, os.O_RDWR))
            return NicFds(fds[0], fds[1] if len(fds) > 1 else None)
        except BaseException:
            for fd in fds:
                os.close(fd)
            self.release(nic)
            raise

    def attach(self, nic: Nic) -> None:
        return None  # made complete (MAC, MTU, up) by open, before QEMU started

    def host_link(self, request: NetworkRequest) -> str | None:
        return request.source  # the parent carries the node's address

    def release(self, nic: Nic) -> None:
        """Delete the VM's macvtap: only a macvtap of its name on its parent, never
        another interface that happens to carry the name."""
        info = link(nic.ifname)
        if info is None or link_kind(info) != "macvtap" or info.get("link") != nic.source:
            return
        run_ip("link", "del", "dev", nic.ifname)


def _macvtap_device(ifname: str) -> int:
    """The ``dev_t`` of macvtap ``ifname``'s character device.

    Not ``/dev/tap<ifindex>``: ifindexes repeat across network namespaces while that
    name is global, so the node may belong to another namespace's macvtap (or be
    missing). The kernel's own ``major:minor`` is in sysfs, but only in a sysfs mounted
    from this network namespace: a process entered with ``nsenter --net`` still sees the
    host's. When ours does not show this very link (same ifindex), a private mount
    namespace mounts one."""
    info = link(ifname)
    if info is None:
        raise RuntimeFailure(f"the macvtap {ifname} vanished right after it was made")
    index = int(info["ifindex"])
    rel = f"{ifname}/macvtap/tap{index}/dev"
    own = SYSFS_NET / ifname / "ifindex"
    try:
        if own.read_text().strip() == str(index):
            text = (SYSFS_NET / rel).read_text()
            return _dev_t(text, ifname)
    except OSError:
        pass
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         'mount -t sysfs sysfs /sys && cat "/sys/class/net/$1"', "sh", rel],
        capture_output=True, text=True, timeout=IP_TIMEOUT, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeFailure(f"cannot read macvtap {ifname}'s device number: {proc.stderr.strip()}")
    return _dev_t(proc.stdout, ifname)


def _dev_t(text: str, ifname: str) -> int:
    major, _, minor = text.strip().partition(":")
    if not (major.isdigit() and minor.isdigit()):
        raise RuntimeFailure(f"macvtap {ifname}: unexpected device number {text.strip()!r}")
    return os.makedev(int(major), int(minor))


def _open_char_device(device: int, node: Path) -> int:
    """Open a character device through a node of our own (root only, removed at once:
    the descriptor is all QEMU needs)."""
    os.mknod(node, 0o600 | stat.S_IFCHR, device)
    try:
        return os.open(node, os.O_RDWR)
    finally:
        node.unlink()
