"""A VM's network interfaces on the host network: ``--network`` text -> checked ``Nic``s,
and their host side through a VM's life.

Network kinds are a registry (``NETWORK_KINDS``), as backends and render targets are: a
kind (one module each: net/bridge.py, net/macvtap.py, net/vf.py, or a plugin's) resolves
a request into a ``Nic`` (every check on the host before anything starts, and how QEMU
and libvirt wire it), makes and opens its host side where QEMU cannot (before QEMU
starts), attaches it once QEMU has opened it (before any vCPU runs) and releases it
once QEMU is gone. What the kinds share is in net/base.py.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from hpcvm.bootspec import Nic, NicModel
from hpcvm.errors import UsageError
from hpcvm.nic_models import NIC_MODELS, VFIO
from hpcvm.registry import Registry
from hpcvm.runtime.net import netguard
from hpcvm.runtime.net.base import (
    DEFAULT_BRIDGE,
    MIN_MTU,
    OPTIONS,
    NetworkKind,
    NetworkRequest,
    NicFds,
    Warn,
    ifname_for,
    ipv4_of,
    is_root,
    link,
    mac_for,
    parse_address,
)
from hpcvm.runtime.net.bridge import BridgeKind
from hpcvm.runtime.net.macvtap import MacvtapKind
from hpcvm.runtime.net.vf import VfKind

__all__ = [
    "NETWORK_KINDS",
    "NetworkKind",
    "NetworkRequest",
    "NicFds",
    "Warn",
    "ifname_for",
    "is_root",
    "mac_for",
    "parse_address",
]

NETWORK_KINDS: Registry[NetworkKind] = Registry("network kind")
NETWORK_KINDS.register("bridge", BridgeKind())
NETWORK_KINDS.register("vf", VfKind())
NETWORK_KINDS.register("macvtap", MacvtapKind())


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


def with_nic_model(text: str, model: str | None) -> str:
    """``--network`` text with its NIC model set to ``model`` (a VM variant's, bench's
    ``vm:hpc+e1000``); unchanged for None. UsageError for a kind whose NIC has no model
    (a passed-through VF is the device itself)."""
    if model is None:
        return text
    request = parse_network(text)
    if request.kind == "vf":
        raise UsageError(
            f"--network {text!r} passes a VF through, which has no NIC model: a NIC variant "
            "(+e1000, +virtio) needs --network bridge=... or macvtap=..."
        )
    fields = [f"{request.kind}={request.source}", f"model={_model(model, text)}"]
    if request.mtu is not None:
        fields.append(f"mtu={request.mtu}")
    return ",".join(fields)


def _model(value: str, text: str) -> NicModel:
    if value in NIC_MODELS:
        return value
    names = " or ".join(NIC_MODELS)
    raise UsageError(f"--network {text!r}: unknown model {value!r}: use {names}")


def _mtu(value: str, text: str) -> int:
    try:
        mtu = int(value)
    except ValueError:
        raise UsageError(f"--network {text!r}: mtu={value!r} is not a number") from None
    if mtu < MIN_MTU:
        raise UsageError(f"--network {text!r}: mtu={mtu} is below the IPv4 minimum {MIN_MTU}")
    return mtu


def passthrough_of(nics: Sequence[Nic]) -> tuple[str, ...]:
    """The PCI addresses the plan must pass through for these NICs (their VFs): a
    ``vfio`` NIC is the device itself."""
    return tuple(nic.source for nic in nics if nic.model == VFIO)


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
        for i, nic in enumerate(with_names(nics, opened))
    )


def with_names(nics: Sequence[Nic], opened: dict[int, NicFds]) -> tuple[Nic, ...]:
    """The NICs with the link names the kernel chose while they were opened (a bridge
    helper's tap), to be recorded."""
    return tuple(
        nic.model_copy(update={"ifname": opened[i].ifname})
        if i in opened and opened[i].ifname
        else nic
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


# -- what the runtime calls -------------------------------------------------------------


def resolve_nics(
    network: str | None,
    address: str | None,
    *,
    vm: str,
    privileged: bool,
    warn: Warn | None = None,
    mac: str | None = None,
) -> tuple[Nic, ...]:
    """The VM's NICs from ``--network``/``--address`` (none without ``--network``);
    ``mac``: the NIC's MAC instead of the one ``vm`` gives (a VM migrated in).

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
    nic = kind.resolve(request, vm=vm, index=0, address=address, warn=warn or _ignore)
    return (nic if mac is None else nic.model_copy(update={"mac": mac}),)


def attach_nics(nics: Sequence[Nic], *, by_daemon: bool = False) -> None:
    """Connect each NIC's host side once QEMU runs paused; with ``by_daemon``
    (libvirt), only what the daemon does not do itself."""
    for nic in nics:
        kind = NETWORK_KINDS.get_or_refuse(nic.kind)
        if not (by_daemon and kind.libvirt_attaches):
            kind.attach(nic)
        elif isinstance(kind, BridgeKind) and link(nic.ifname) is not None:
            # libvirt made and enslaved the tap: its rules all the same (a tap of another
            # name is no tap of a guard: its frames are dropped, the safe side)
            netguard.guard(nic)


def _ignore(_text: str) -> None:
    return None


ADDRESS_IN_USE = "address-in-use"  # HpcvmError.cause: duplicate address detection failed


def node_address(network: str) -> ipaddress.IPv4Interface:
    """This node's own IPv4 address on the link ``--network`` attaches VMs to (what
    ``--address auto`` derives VM addresses from); UsageError when there is none."""
    request = parse_network(network)
    link = NETWORK_KINDS.get_or_refuse(request.kind).host_link(request)
    if link is None:
        raise UsageError(
            f"--network {network}: its kind gives no host link to derive VM addresses "
            "from: give --address IP/PREFIX"
        )
    found = ipv4_of(link)
    if not found:
        raise UsageError(
            f"{link} has no IPv4 address on this node, and --address auto derives each "
            f"VM's address from the node's own: give {link} its address, or --address"
        )
    return found[0]
