"""``bridge``: a tap in an existing Linux bridge, with vhost-net when
``/dev/vhost-net`` exists (and this user may open it).

For a user who is not root, the tap comes from QEMU's setuid bridge helper, an admin's
grant (net/bridge_helper.py): hpcvm runs it just before QEMU starts and hands QEMU the
tap's descriptor, which the helper has already put into the bridge.

As root, with the QEMU backend QEMU itself creates the tap (``-netdev tap,ifname=...``, opened as
root before ``-runas`` drops privileges), and hpcvm only puts it into the bridge while
the guest is still paused. The tap is not persistent: the kernel removes it when QEMU
exits, however QEMU exits (``down``, a crash, SIGKILL), so a dead VM can never leave a
tap behind and nothing needs a cleanup that could touch an interface hpcvm did not make.
No unprivileged user owns the tap (only QEMU's already-open descriptor reaches it).
libvirt creates, enslaves and removes its tap itself (``<interface type='bridge'>``).

Every tap, a user's and root's, gets anti-spoofing rules before its guest runs
(net/netguard.py: the VM's MAC and address only): a user's as soon as the bridge helper
hands it over, before QEMU starts; root's once QEMU made it, while the guest is paused;
libvirt's likewise (network.attach_nics). A tap without them carries nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcvm.bootspec import Nic, NicWiring
from hpcvm.errors import UsageError
from hpcvm.host.privilege import for_admin
from hpcvm.runtime.net import bridge_helper, netguard
from hpcvm.runtime.net.base import (
    TUN,
    VHOST_NET,
    NetworkRequest,
    NicFds,
    Warn,
    is_root,
    link,
    link_kind,
    named_link_nic,
    run_ip,
    tap_mac,
)


def check_tun(tun: Path = TUN) -> None:
    """A tap needs the tun device; loading its module is root's to do (``tun``: the
    device node; a parameter so a test can name one that does not exist)."""
    if not tun.exists():
        raise UsageError(
            f"{tun} does not exist: " + for_admin("load the tun module (`modprobe tun`)")
        )


class BridgeKind:
    """A tap in an existing Linux bridge (the host's NIC is in the bridge too)."""

    libvirt_attaches = True  # <interface type='bridge'>: libvirt makes and enslaves the tap
    privileged = False  # root makes the tap; a user gets one from QEMU's bridge helper

    def resolve(
        self, request: NetworkRequest, *, vm: str, index: int, address: str | None, warn: Warn
    ) -> Nic:
        bridge = request.source
        info = link(bridge)
        if info is None:
            raise UsageError(
                f"bridge {bridge!r} does not exist in this network namespace: "
                + for_admin(f"create it (`ip link add {bridge} type bridge`)")
                + " or name another with --network bridge=NAME"
            )
        if link_kind(info) != "bridge":
            raise UsageError(
                f"{bridge!r} is not a bridge (it is a {link_kind(info) or 'plain device'}): "
                "name a bridge with --network bridge=NAME"
            )
        check_tun()
        helper = not is_root()
        if helper:
            bridge_helper.check_grant(bridge)
        netguard.check_grant(bridge)
        nic = named_link_nic("bridge", request, info, vm=vm, index=index,
                             address=address, warn=warn)  # fmt: skip
        if helper:  # vhost-net only where this user may open it
            nic = nic.model_copy(
                update={"vhost": nic.vhost and os.access(VHOST_NET, os.R_OK | os.W_OK)}
            )
        return nic.model_copy(update={"wiring": self.wiring(nic, helper=helper)})

    def wiring(self, nic: Nic, *, helper: bool = False) -> NicWiring:
        """As root, QEMU creates the tap by name (no helper script; vhost-net when there
        is one); for a user, QEMU gets the bridge helper's tap as a descriptor. libvirt's
        ``<interface type='bridge'>`` does either itself."""
        options = [] if helper else [("ifname", nic.ifname), ("script", "no"), ("downscript", "no")]
        if nic.vhost and not helper:
            options.append(("vhost", "on"))  # with fds, the renderer adds vhost and vhostfd
        return NicWiring(
            netdev="tap",
            netdev_options=tuple(options),
            fds_from_hpcvm=helper,
            libvirt_type="bridge",
            libvirt_source=(("bridge", nic.source),),
        )

    def attach(self, nic: Nic) -> None:
        """Into the bridge with the NIC's MTU and the tap's own MAC, guarded, then up (the
        bridge helper's tap is in the bridge and guarded already)."""
        if nic.wiring.fds_from_hpcvm:
            return
        run_ip("link", "set", "dev", nic.ifname, "address", tap_mac(nic.mac), "mtu", str(nic.mtu))
        run_ip("link", "set", "dev", nic.ifname, "master", nic.source)
        netguard.guard(nic)
        run_ip("link", "set", "dev", nic.ifname, "up")

    def open(self, nic: Nic, run_dir: Path) -> NicFds | None:
        """For a user, the bridge helper's tap (and vhost-net's descriptor); as root
        nothing: QEMU creates the tap itself (``ifname=``)."""
        if not nic.wiring.fds_from_hpcvm:
            return None
        tap, name = bridge_helper.open_tap(nic.source)
        try:
            netguard.guard(nic.model_copy(update={"ifname": name}), fd=tap)
            vhost = os.open(VHOST_NET, os.O_RDWR) if nic.vhost else None
        except BaseException:
            os.close(tap)
            raise
        return NicFds(tap, vhost, ifname=name)

    def release(self, nic: Nic) -> None:
        """The kernel removed the tap with QEMU's descriptor; its rules go now."""
        netguard.collect()

    def host_link(self, request: NetworkRequest) -> str | None:
        return request.source
