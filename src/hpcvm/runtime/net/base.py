"""What every network kind shares (runtime/net/network.py has the kinds' registry): the
parsed request, the kind's interface, deterministic names, addresses, and reading host
links through netlink (``ip -j``), never /sys/class/net: a process moved into a network
namespace with ``nsenter --net`` still sees the host's sysfs.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from hpcvm.bootspec import Nic, NicModel
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.nic_models import DEFAULT_NIC_MODEL, nic_model

Warn = Callable[[str], None]

DEFAULT_BRIDGE = "br0"  # ``--network model=e1000`` alone: a tap in br0
OPTIONS = ("model", "mtu")  # keys of --network besides the kind
MAC_FIRST_OCTET = "0a"  # locally administered (bit 1), unicast (bit 0 clear)
TAP_FIRST_OCTET = "fe"  # the tap's own MAC: high, so the bridge never adopts it
IFNAME_PREFIX = "hv"  # not "vir": Open MPI's out-of-band layer skips vir* interfaces
MIN_MTU = 68  # RFC 791: every IPv4 host must take this
TUN = Path("/dev/net/tun")
VHOST_NET = Path("/dev/vhost-net")
IP_TIMEOUT = 30.0


@dataclass(frozen=True)
class NetworkRequest:
    """``--network`` parsed: which kind, on what, which device model, and an MTU below
    the host's (None: the host network's own)."""

    kind: str
    source: str
    model: NicModel = DEFAULT_NIC_MODEL
    mtu: int | None = None


class NetworkKind(Protocol):
    """One way to connect a VM to the host network. ``resolve`` decides everything about
    the NIC, how QEMU and libvirt wire it (``Nic.wiring``) included, so a kind is one
    class and one ``NETWORK_KINDS.register`` call, hpcvm's own as a plugin's."""

    libvirt_attaches: bool  # libvirt connects the host side itself (attach is skipped)
    privileged: bool  # its host side needs CAP_NET_ADMIN: root with the QEMU backend

    def resolve(
        self, request: NetworkRequest, *, vm: str, index: int, address: str | None, warn: Warn
    ) -> Nic:
        """The NIC for ``request``; UsageError for anything the host cannot give, before
        anything is started."""
        ...

    def attach(self, nic: Nic) -> None:
        """Connect the host side QEMU opened (QEMU backend; the guest is still paused)."""
        ...

    def open(self, nic: Nic, run_dir: Path) -> NicFds | None:
        """Make the host side before QEMU starts and open it for QEMU (None: QEMU opens
        its own, as with ``ifname=``)."""
        ...

    def release(self, nic: Nic) -> None:
        """Remove what ``open`` made once QEMU is gone (nothing for kinds whose host side
        dies with QEMU)."""
        ...

    def host_link(self, request: NetworkRequest) -> str | None:
        """The host link whose IPv4 address is this node's on the VMs' segment (the
        bridge, the macvtap's parent, the VF's PF); None when the kind has none
        (``--address auto`` then needs an explicit address)."""
        ...


@dataclass(frozen=True)
class NicFds:
    """Descriptors hpcvm opened for QEMU (``-netdev tap,fd=,vhostfd=``); QEMU inherits
    them and hpcvm closes its copies once QEMU runs."""

    tap: int
    vhost: int | None = None
    ifname: str | None = None  # the link's name where the kernel chose it (bridge helper)

    def all(self) -> tuple[int, ...]:
        return (self.tap,) if self.vhost is None else (self.tap, self.vhost)


def parse_address(text: str) -> ipaddress.IPv4Interface:
    """``10.77.0.101/24``: an IPv4 host address with its prefix, not the network's or
    broadcast address."""
    if "/" not in text:
        raise UsageError(f"--address {text!r} has no prefix length: write it as {text}/24")
    try:
        iface = ipaddress.IPv4Interface(text)
    except ValueError as exc:
        raise UsageError(f"--address {text!r} is not an IPv4 address/prefix: {exc}") from None
    net = iface.network
    if net.prefixlen < 31 and iface.ip in (net.network_address, net.broadcast_address):
        raise UsageError(
            f"--address {text!r} is the network's or broadcast address of {net}: use a host address"
        )
    return iface


# -- deterministic names --------------------------------------------------------------


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(["hpcvm-nic", *map(str, parts)]).encode()).digest()


def mac_for(vm: str, index: int = 0, address: str | None = None) -> str:
    """The guest MAC of NIC ``index`` of VM ``vm`` with ``address``: ``0a`` (locally
    administered, unicast) and 40 bits of a hash, so a VM keeps its MAC across restarts,
    and two VMs' MACs collide with odds of about 1 in 10^12. The address is part of the
    hash because MACs must differ across the whole segment, and a job's VMs may all
    carry the job's name (one per node) while their addresses always differ."""
    digest = _digest(vm, index, address or "")
    return ":".join([MAC_FIRST_OCTET, *(f"{b:02x}" for b in digest[:5])])


def tap_mac(mac: str) -> str:
    """The tap's own MAC: the guest's with ``fe`` first. A bridge takes the lowest MAC
    of its ports when it has none set; ``fe`` keeps the bridge's MAC from changing when
    a VM joins (as libvirt does)."""
    return f"{TAP_FIRST_OCTET}{mac[2:]}"


def ifname_for(vm: str, index: int = 0) -> str:
    """The host tap's name: ``hv`` and 10 hex digits of a hash of the VM's name (12 of
    the kernel's 15 characters); unique per host, which is all a tap name needs."""
    return IFNAME_PREFIX + _digest(vm, index).hex()[:10]


# -- reading host links (netlink through iproute2) ------------------------------------


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("ip") is None:
        raise UsageError("`ip` (iproute2) is not installed: install the iproute2 package")
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=False
    )


def link(name: str) -> dict[str, Any] | None:
    """``ip -j -d link show dev NAME`` (kind in ``linkinfo.info_kind``), or None when
    there is no such link in this network namespace."""
    proc = ip("-j", "-d", "link", "show", "dev", name)
    if proc.returncode != 0:
        return None
    found = json.loads(proc.stdout or "[]")
    return cast(dict[str, Any], found[0]) if found else None


def link_kind(info: dict[str, Any]) -> str:
    """``bridge``, ``tun``, ``veth``... or "" for a plain device."""
    return str(info.get("linkinfo", {}).get("info_kind", ""))


def ipv4_of(name: str) -> list[ipaddress.IPv4Interface]:
    """The IPv4 addresses (with prefixes) of link ``name``."""
    proc = ip("-j", "-4", "addr", "show", "dev", name)
    if proc.returncode != 0:
        return []
    out: list[ipaddress.IPv4Interface] = []
    for entry in json.loads(proc.stdout or "[]"):
        for addr in entry.get("addr_info", []):
            out.append(ipaddress.IPv4Interface(f"{addr['local']}/{addr['prefixlen']}"))
    return out


def run_ip(*args: str) -> None:
    proc = ip(*args)
    if proc.returncode != 0:
        raise RuntimeFailure(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")


def check_address(
    address: ipaddress.IPv4Interface, bridge: str, on_bridge: Sequence[ipaddress.IPv4Interface]
) -> str | None:
    """Why ``address`` does not fit the bridge's subnets (None: it fits). Pure."""
    for own in on_bridge:
        if address.ip == own.ip:
            return f"--address {address} is {bridge}'s own address: give the VM another"
    if on_bridge and not any(address.network == own.network for own in on_bridge):
        nets = ", ".join(str(own.network) for own in on_bridge)
        return f"--address {address} is outside {bridge}'s subnet {nets}: use one in it"
    return None


def named_link_nic(
    kind: str,
    request: NetworkRequest,
    info: dict[str, Any],
    *,
    vm: str,
    index: int,
    address: str | None,
    warn: Warn,
) -> Nic:
    """The NIC of a host-side link hpcvm names (a tap or macvtap on ``request.source``,
    read as ``info``): its name must be free, its MTU and address fit the source."""
    ifname = ifname_for(vm, index)
    if link(ifname) is not None:
        raise UsageError(
            f"an interface named {ifname} (VM {vm}'s {kind} link) already exists: remove it "
            f"(`ip link del {ifname}`) if nothing uses it, or choose another --name"
        )
    mtu = fitting_mtu(request.source, int(info["mtu"]), request.mtu)
    iface = parse_address(address) if address is not None else None
    if iface is not None:
        check_subnet(iface, request.source, warn)
    return Nic(
        kind=kind,
        source=request.source,
        model=request.model,
        mac=mac_for(vm, index, str(iface) if iface is not None else None),
        ifname=ifname,
        address=str(iface) if iface is not None else None,
        mtu=mtu,
        vhost=nic_model(request.model).paravirtual and VHOST_NET.exists(),
    )


def fitting_mtu(bridge: str, host_mtu: int, wanted: int | None) -> int:
    if wanted is None:
        return host_mtu
    if wanted > host_mtu:
        raise UsageError(
            f"--network mtu={wanted} is above {bridge}'s MTU {host_mtu}: frames that large "
            "would be dropped; give at most that, or leave mtu out"
        )
    return wanted


def check_subnet(iface: ipaddress.IPv4Interface, bridge: str, warn: Warn) -> None:
    on_bridge = ipv4_of(bridge)
    if not on_bridge:
        warn(f"bridge {bridge} has no IPv4 address: --address {iface} is not checked")
        return
    problem = check_address(iface, bridge, on_bridge)
    if problem:
        raise UsageError(problem)


def is_root() -> bool:
    return os.geteuid() == 0
