"""A VM's network interface on the host network: ``--network`` text -> a checked ``Nic``.

Network kinds are a registry (``NETWORK_KINDS``), as backends and render targets are:
a kind resolves a request into a ``Nic`` (every check on the host before anything
starts) and attaches the host side once QEMU has opened it (before any vCPU runs).

``bridge``: a tap in an existing Linux bridge, with
vhost-net when ``/dev/vhost-net`` exists. With the QEMU backend QEMU itself creates the
tap (``-netdev tap,ifname=...``, opened as root before ``-runas`` drops privileges), and
hpcvm only puts it into the bridge while the guest is still paused. The tap is not
persistent: the kernel removes it when QEMU exits, however QEMU exits (``down``, a
crash, SIGKILL), so a dead VM can never leave a tap behind and nothing needs a cleanup
that could touch an interface hpcvm did not make. No unprivileged user owns the tap
(only QEMU's already-open descriptor reaches it). libvirt creates, enslaves and removes
its tap itself (``<interface type='bridge'>``, render/libvirt.py).

``vf``: an SR-IOV virtual function passed through with VFIO, planned like every
passthrough device (plan/passthrough.py); hpcvm sets its MAC on the physical function.

``macvtap``: a macvtap link on a parent device (the host NIC, or a VLAN or bond on it) in
bridge mode: the guest's frames leave through the parent's driver with no bridge in
between. Unlike a tap, a macvtap link outlives the descriptor QEMU holds, so hpcvm
creates it under the VM's deterministic name just before QEMU starts, hands QEMU an
open descriptor on its character device (``-netdev tap,fd=N``), and deletes it (only a
macvtap of that name on that parent) whenever the VM is stopped, torn down or found
stale. libvirt does all of this itself (``<interface type='direct'>``).

Host links are read through netlink (``ip -j``), never /sys/class/net: a process moved
into a network namespace with ``nsenter --net`` still sees the host's sysfs.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from hpcvm.bootspec import Nic, NicModel, NicWiring
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.registry import Registry

Warn = Callable[[str], None]

DEFAULT_BRIDGE = "br0"  # ``--network model=e1000`` alone: a tap in br0
MODELS: tuple[NicModel, ...] = ("virtio", "e1000")
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
    model: NicModel = "virtio"
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


@dataclass(frozen=True)
class NicFds:
    """Descriptors hpcvm opened for QEMU (``-netdev tap,fd=,vhostfd=``); QEMU inherits
    them and hpcvm closes its copies once QEMU runs."""

    tap: int
    vhost: int | None = None

    def all(self) -> tuple[int, ...]:
        return (self.tap,) if self.vhost is None else (self.tap, self.vhost)


# -- parsing --------------------------------------------------------------------------


def parse_network(text: str) -> NetworkRequest:
    """``bridge=br0[,model=e1000][,mtu=N]``, ``macvtap=eth0[,model=...][,mtu=N]`` or
    ``vf=auto|BDF[,mtu=N]``; without a kind key, a tap in br0.

    Each key at most once; an unknown key is one line naming the known kinds and options.
    """
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise UsageError(
                f"--network {text!r}: {part!r} is not KEY=VALUE: use e.g. bridge=br0,model=e1000"
            )
        if key not in NETWORK_KINDS and key not in OPTIONS:
            raise UsageError(
                f"--network {text!r}: unknown key {key!r}: kinds are "
                f"{', '.join(NETWORK_KINDS)}; options are {', '.join(OPTIONS)}"
            )
        if key in fields:
            raise UsageError(f"--network {text!r}: {key} is given twice")
        fields[key] = value.strip()
    kinds = [k for k in fields if k in NETWORK_KINDS]
    if len(kinds) > 1:
        raise UsageError(f"--network {text!r}: give one kind, not {' and '.join(kinds)}")
    kind = kinds[0] if kinds else "bridge"
    return NetworkRequest(
        kind=kind,
        source=fields.get(kind, DEFAULT_BRIDGE),
        model=_model(fields.get("model", "virtio"), text),
        mtu=_mtu(fields["mtu"], text) if "mtu" in fields else None,
    )


def _model(value: str, text: str) -> NicModel:
    for model in MODELS:
        if value == model:
            return model
    raise UsageError(f"--network {text!r}: unknown model {value!r}: use {' or '.join(MODELS)}")


def _mtu(value: str, text: str) -> int:
    try:
        mtu = int(value)
    except ValueError:
        raise UsageError(f"--network {text!r}: mtu={value!r} is not a number") from None
    if mtu < MIN_MTU:
        raise UsageError(f"--network {text!r}: mtu={mtu} is below the IPv4 minimum {MIN_MTU}")
    return mtu


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


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("ip") is None:
        raise UsageError("`ip` (iproute2) is not installed: install the iproute2 package")
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=False
    )


def link(name: str) -> dict[str, Any] | None:
    """``ip -j -d link show dev NAME`` (kind in ``linkinfo.info_kind``), or None when
    there is no such link in this network namespace."""
    proc = _ip("-j", "-d", "link", "show", "dev", name)
    if proc.returncode != 0:
        return None
    found = json.loads(proc.stdout or "[]")
    return cast(dict[str, Any], found[0]) if found else None


def link_kind(info: dict[str, Any]) -> str:
    """``bridge``, ``tun``, ``veth``... or "" for a plain device."""
    return str(info.get("linkinfo", {}).get("info_kind", ""))


def ipv4_of(name: str) -> list[ipaddress.IPv4Interface]:
    """The IPv4 addresses (with prefixes) of link ``name``."""
    proc = _ip("-j", "-4", "addr", "show", "dev", name)
    if proc.returncode != 0:
        return []
    out: list[ipaddress.IPv4Interface] = []
    for entry in json.loads(proc.stdout or "[]"):
        for addr in entry.get("addr_info", []):
            out.append(ipaddress.IPv4Interface(f"{addr['local']}/{addr['prefixlen']}"))
    return out


def _run_ip(*args: str) -> None:
    proc = _ip(*args)
    if proc.returncode != 0:
        raise RuntimeFailure(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")


# -- the bridge kind ------------------------------------------------------------------


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


class BridgeKind:
    """A tap in an existing Linux bridge (the host's NIC is in the bridge too)."""

    libvirt_attaches = True  # <interface type='bridge'>: libvirt makes and enslaves the tap
    privileged = True

    def resolve(
        self, request: NetworkRequest, *, vm: str, index: int, address: str | None, warn: Warn
    ) -> Nic:
        bridge = request.source
        info = link(bridge)
        if info is None:
            raise UsageError(
                f"bridge {bridge!r} does not exist in this network namespace: create it "
                f"(`ip link add {bridge} type bridge`) or name another with --network "
                "bridge=NAME"
            )
        if link_kind(info) != "bridge":
            raise UsageError(
                f"{bridge!r} is not a bridge (it is a {link_kind(info) or 'plain device'}): "
                "name a bridge with --network bridge=NAME"
            )
        if not TUN.exists():
            raise UsageError(f"{TUN} does not exist: load the tun module (`modprobe tun`)")
        nic = _virtio_or_emulated_nic("bridge", request, info, vm=vm, index=index,
                                      address=address, warn=warn)  # fmt: skip
        return nic.model_copy(update={"wiring": self.wiring(nic)})

    def wiring(self, nic: Nic) -> NicWiring:
        """QEMU creates the tap by name (no helper script; vhost-net when there is
        one); libvirt's ``<interface type='bridge'>`` does the same."""
        options = [("ifname", nic.ifname), ("script", "no"), ("downscript", "no")]
        if nic.vhost:
            options.append(("vhost", "on"))
        return NicWiring(
            netdev="tap",
            netdev_options=tuple(options),
            libvirt_type="bridge",
            libvirt_source=(("bridge", nic.source),),
        )

    def attach(self, nic: Nic) -> None:
        """Into the bridge with the NIC's MTU and the tap's own MAC, then up."""
        _run_ip("link", "set", "dev", nic.ifname, "address", tap_mac(nic.mac), "mtu", str(nic.mtu))
        _run_ip("link", "set", "dev", nic.ifname, "master", nic.source, "up")

    def open(self, nic: Nic, run_dir: Path) -> NicFds | None:
        return None  # QEMU creates the tap itself (ifname=)

    def release(self, nic: Nic) -> None:
        return None  # the kernel removed the tap with QEMU's descriptor


def _virtio_or_emulated_nic(
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
    mtu = _bridge_mtu(request.source, int(info["mtu"]), request.mtu)
    iface = parse_address(address) if address is not None else None
    if iface is not None:
        _check_subnet(iface, request.source, warn)
    return Nic(
        kind=kind,
        source=request.source,
        model=request.model,
        mac=mac_for(vm, index, str(iface) if iface is not None else None),
        ifname=ifname,
        address=str(iface) if iface is not None else None,
        mtu=mtu,
        vhost=request.model == "virtio" and VHOST_NET.exists(),
    )


def _bridge_mtu(bridge: str, host_mtu: int, wanted: int | None) -> int:
    if wanted is None:
        return host_mtu
    if wanted > host_mtu:
        raise UsageError(
            f"--network mtu={wanted} is above {bridge}'s MTU {host_mtu}: frames that large "
            "would be dropped; give at most that, or leave mtu out"
        )
    return wanted


def _check_subnet(iface: ipaddress.IPv4Interface, bridge: str, warn: Warn) -> None:
    on_bridge = ipv4_of(bridge)
    if not on_bridge:
        warn(f"bridge {bridge} has no IPv4 address: --address {iface} is not checked")
        return
    problem = check_address(iface, bridge, on_bridge)
    if problem:
        raise UsageError(problem)


# -- the vf kind --------------------------------------------------------------------------


@dataclass(frozen=True)
class VirtualFunction:
    """An SR-IOV VF as sysfs shows it: its physical function, its index there, and the
    PF's network interface (through which the VF's MAC is set)."""

    bdf: str
    pf_bdf: str
    index: int
    pf_netdev: str
    driver: str | None


class VfKind:
    """An SR-IOV virtual function passed through with VFIO: the guest drives the NIC's
    own hardware, no tap, no QEMU on the datapath. The VF becomes one of the plan's
    passthrough devices (``--passthrough``), so the planner checks its IOMMU group and
    places the vCPUs by its NUMA node like any other; hpcvm only sets its MAC on the PF
    (``ip link set PF vf N mac M``) so the guest finds it by MAC like any NIC.

    ``sysfs`` is a root holding ``bus/pci/devices`` (``/sys`` live; a fake tree in the
    unit tests: no SR-IOV device exists on the machines hpcvm is tested on).
    """

    libvirt_attaches = False  # the VF is a <hostdev> of the plan; its MAC is set by hpcvm
    privileged = True

    def __init__(self, sysfs: Path = Path("/sys")) -> None:
        self.sysfs = sysfs

    def _devices(self) -> Path:
        return self.sysfs / "bus" / "pci" / "devices"

    def virtual_function(self, bdf: str) -> VirtualFunction:
        """The VF at ``bdf``; UsageError when there is none or it is not a VF."""
        dev = self._devices() / bdf
        if not dev.exists():
            raise UsageError(f"--network vf={bdf}: no PCI device {bdf} on this host")
        physfn = dev / "physfn"
        if not physfn.exists():
            raise UsageError(
                f"--network vf={bdf}: {bdf} is not an SR-IOV virtual function (no physfn); "
                "create VFs with `echo N > /sys/bus/pci/devices/PF/sriov_numvfs`"
            )
        pf = physfn.resolve()
        index = next(
            (int(v.name[len("virtfn") :]) for v in pf.glob("virtfn*") if v.resolve().name == bdf),
            None,
        )
        netdevs = sorted(p.name for p in (pf / "net").iterdir()) if (pf / "net").is_dir() else []
        if index is None or not netdevs:
            raise UsageError(
                f"--network vf={bdf}: its physical function {pf.name} has no network "
                "interface to set the VF's MAC through: bind the PF's driver"
            )
        driver = (dev / "driver").resolve().name if (dev / "driver").exists() else None
        return VirtualFunction(bdf, pf.name, index, netdevs[0], driver)

    def free_vf(self, taken: Sequence[str]) -> str:
        """``vf=auto``: the first VF (by address) bound to vfio-pci that no VM of this
        host's hpcvm uses; UsageError naming what was found otherwise."""
        devices = self._devices()
        vfs = sorted(d.name for d in devices.iterdir() if (d / "physfn").exists())
        for bdf in vfs:
            driver = devices / bdf / "driver"
            if bdf not in taken and driver.exists() and driver.resolve().name == "vfio-pci":
                return bdf
        raise UsageError(
            f"--network vf=auto: no free SR-IOV VF bound to vfio-pci (VFs: "
            f"{', '.join(vfs) or 'none'}; in use: {', '.join(taken) or 'none'}): bind one "
            "with driverctl or vfio-pci's new_id, or name one with vf=DDDD:BB:DD.F"
        )

    def resolve(
        self, request: NetworkRequest, *, vm: str, index: int, address: str | None, warn: Warn
    ) -> Nic:
        from hpcvm.plan.passthrough import normalise_bdf

        if request.model != "virtio":
            raise UsageError("--network vf=...: a VF is the host NIC's own hardware, no model=")
        if request.source == "auto":
            bdf = self.free_vf(_vfs_in_use())
        else:
            bdf = normalise_bdf(request.source)
        vf = self.virtual_function(bdf)
        info = link(vf.pf_netdev)
        if info is None:
            raise UsageError(
                f"--network vf={bdf}: its PF's interface {vf.pf_netdev} is not in this "
                "network namespace: run hpcvm where the PF is"
            )
        mtu = _bridge_mtu(vf.pf_netdev, int(info["mtu"]), request.mtu)
        iface = parse_address(address) if address is not None else None
        if iface is not None:
            _check_subnet(iface, vf.pf_netdev, warn)
        return Nic(
            kind="vf",
            source=bdf,
            model="vfio",
            mac=mac_for(vm, index, str(iface) if iface is not None else None),
            ifname=vf.pf_netdev,
            address=str(iface) if iface is not None else None,
            mtu=mtu,
        )

    def attach(self, nic: Nic) -> None:
        """The VF's MAC, set on its PF (the guest, still paused, has not probed it)."""
        vf = self.virtual_function(nic.source)
        _run_ip("link", "set", "dev", vf.pf_netdev, "vf", str(vf.index), "mac", nic.mac)

    def open(self, nic: Nic, run_dir: Path) -> NicFds | None:
        return None  # a passthrough device of the plan

    def release(self, nic: Nic) -> None:
        return None


def _vfs_in_use() -> list[str]:
    """The VFs that VMs recorded on this host use (vf=auto must not take them)."""
    from hpcvm.runtime import state

    return [
        nic.source
        for entry in state.list_entries()
        if entry.machine is not None and entry.state != "stale"
        for nic in entry.machine.boot.nics
        if nic.model == "vfio"
    ]


def passthrough_of(nics: Sequence[Nic]) -> tuple[str, ...]:
    """The PCI addresses the plan must pass through for these NICs (their VFs): a
    ``vfio`` NIC is the device itself."""
    return tuple(nic.source for nic in nics if nic.model == "vfio")


# -- the macvtap kind ------------------------------------------------------------------

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
        nic = _virtio_or_emulated_nic("macvtap", request, info, vm=vm, index=index,
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
        _run_ip(
            "link", "add", "link", nic.source, "name", nic.ifname, "address", nic.mac,
            "mtu", str(nic.mtu), "type", "macvtap", "mode", MACVTAP_MODE,
        )  # fmt: skip
        fds: list[int] = []
        try:
            _run_ip("link", "set", "dev", nic.ifname, "up")
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

    def release(self, nic: Nic) -> None:
        """Delete the VM's macvtap: only a macvtap of its name on its parent, never
        another interface that happens to carry the name."""
        info = link(nic.ifname)
        if info is None or link_kind(info) != "macvtap" or info.get("link") != nic.source:
            return
        _run_ip("link", "del", "dev", nic.ifname)


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


def open_nics(nics: Sequence[Nic], run_dir: Path) -> dict[int, NicFds]:
    """Before QEMU starts: each NIC's host side that hpcvm must make and open, by NIC
    index. On failure what was made is released and what was opened closed."""
    opened: dict[int, NicFds] = {}
    try:
        for index, nic in enumerate(nics):
            fds = NETWORK_KINDS.get_or_refuse(nic.kind).open(nic, run_dir)
            if fds is not None:
                opened[index] = fds
    except BaseException:
        close_fds(opened)
        release_nics(nics)
        raise
    return opened


def close_fds(opened: dict[int, NicFds]) -> None:
    for fds in opened.values():
        for fd in fds.all():
            os.close(fd)


def with_fds(nics: Sequence[Nic], opened: dict[int, NicFds]) -> tuple[Nic, ...]:
    """The NICs with the descriptors opened for them, for rendering QEMU's command line
    in the process that starts it (``Nic.fds`` is never recorded)."""
    return tuple(
        nic.model_copy(update={"fds": opened[i].all()}) if i in opened else nic
        for i, nic in enumerate(nics)
    )


def release_nics(nics: Sequence[Nic], *, by_daemon: bool = False) -> None:
    """After QEMU is gone: remove what hpcvm made for each NIC; with ``by_daemon``
    (libvirt), nothing the daemon removes itself."""
    for nic in nics:
        if nic.kind not in NETWORK_KINDS:
            continue
        kind = NETWORK_KINDS[nic.kind]
        if not (by_daemon and kind.libvirt_attaches):
            kind.release(nic)


NETWORK_KINDS: Registry[NetworkKind] = Registry("network kind")
NETWORK_KINDS.register("bridge", BridgeKind())
NETWORK_KINDS.register("vf", VfKind())
NETWORK_KINDS.register("macvtap", MacvtapKind())


# -- what the runtime calls -------------------------------------------------------------


def resolve_nics(
    network: str | None,
    address: str | None,
    *,
    vm: str,
    privileged: bool,
    warn: Warn | None = None,
) -> tuple[Nic, ...]:
    """The VM's NICs from ``--network``/``--address`` (none without ``--network``).

    ``privileged``: whoever creates the tap may (root with the QEMU backend, libvirtd
    with libvirt); otherwise the request is refused here, not by a failing QEMU.
    """
    if network is None:
        if address is not None:
            raise UsageError("--address needs --network (e.g. --network bridge=br0)")
        return ()
    request = parse_network(network)
    kind = NETWORK_KINDS.get_or_refuse(request.kind)
    if kind.privileged and not privileged:
        raise UsageError(
            f"--network {request.kind}=... needs root with the QEMU backend: creating its "
            "host side needs CAP_NET_ADMIN; run hpcvm as root or use --backend libvirt"
        )
    return (kind.resolve(request, vm=vm, index=0, address=address, warn=warn or _ignore),)


def attach_nics(nics: Sequence[Nic], *, by_daemon: bool = False) -> None:
    """Connect each NIC's host side once QEMU runs paused; with ``by_daemon``
    (libvirt), only what the daemon does not do itself."""
    for nic in nics:
        kind = NETWORK_KINDS.get_or_refuse(nic.kind)
        if not (by_daemon and kind.libvirt_attaches):
            kind.attach(nic)


def is_root() -> bool:
    return os.geteuid() == 0


def _ignore(_text: str) -> None:
    return None
