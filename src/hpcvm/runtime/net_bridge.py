"""``bridge``: a tap in an existing Linux bridge, with vhost-net when
``/dev/vhost-net`` exists.

With the QEMU backend QEMU itself creates the tap (``-netdev tap,ifname=...``, opened as
root before ``-runas`` drops privileges), and hpcvm only puts it into the bridge while
the guest is still paused. The tap is not persistent: the kernel removes it when QEMU
exits, however QEMU exits (``down``, a crash, SIGKILL), so a dead VM can never leave a
tap behind and nothing needs a cleanup that could touch an interface hpcvm did not make.
No unprivileged user owns the tap (only QEMU's already-open descriptor reaches it).
libvirt creates, enslaves and removes its tap itself (``<interface type='bridge'>``).
"""

from __future__ import annotations

from pathlib import Path

from hpcvm.bootspec import Nic, NicWiring
from hpcvm.errors import UsageError
from hpcvm.runtime.netlink import (
    TUN,
    NetworkRequest,
    NicFds,
    Warn,
    link,
    link_kind,
    named_link_nic,
    run_ip,
    tap_mac,
)


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
        nic = named_link_nic("bridge", request, info, vm=vm, index=index,
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
        run_ip("link", "set", "dev", nic.ifname, "address", tap_mac(nic.mac), "mtu", str(nic.mtu))
        run_ip("link", "set", "dev", nic.ifname, "master", nic.source, "up")

    def open(self, nic: Nic, run_dir: Path) -> NicFds | None:
        return None  # QEMU creates the tap itself (ifname=)

    def release(self, nic: Nic) -> None:
        return None  # the kernel removed the tap with QEMU's descriptor
