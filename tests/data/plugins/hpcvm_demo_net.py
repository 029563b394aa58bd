"""A throw-away network kind registered from outside hpcvm (tests/integration/
test_cluster_plugins.py): one module, one registry call. ``demo-user=NAME`` gives a VM a
NIC on QEMU's user-mode network (slirp): nothing on the host side to make, attach or
release, no privilege needed. Its wiring (QEMU ``-netdev user``, libvirt
``<interface type='user'>``) is all the renderers learn of it."""

from __future__ import annotations

from pathlib import Path

from hpcvm.bootspec import Nic, NicWiring
from hpcvm.runtime.net.network import (
    NETWORK_KINDS,
    NetworkRequest,
    NicFds,
    Warn,
    ifname_for,
    mac_for,
    parse_address,
)

SLIRP_NET = "10.0.2.0/24"


class DemoUserKind:
    libvirt_attaches = True
    privileged = False

    def resolve(
        self, request: NetworkRequest, *, vm: str, index: int, address: str | None, warn: Warn
    ) -> Nic:
        iface = parse_address(address) if address else None
        return Nic(
            kind="demo-user",
            source=request.source,
            model=request.model,
            mac=mac_for(vm, index, str(iface) if iface else None),
            ifname=ifname_for(vm, index),
            address=str(iface) if iface else None,
            mtu=request.mtu or 1500,
            wiring=NicWiring(
                netdev="user", netdev_options=(("net", SLIRP_NET),), libvirt_type="user"
            ),
        )

    def attach(self, nic: Nic) -> None:
        return None

    def open(self, nic: Nic, run_dir: Path) -> NicFds | None:
        return None

    def release(self, nic: Nic) -> None:
        return None

    def host_link(self, request: NetworkRequest) -> str | None:
        return None  # slirp: the VM is behind QEMU, not on a host link


NETWORK_KINDS.register("demo-user", DemoUserKind())
