"""``vf``: an SR-IOV virtual function passed through with VFIO, planned like every
passthrough device (plan/passthrough.py); hpcvm sets its MAC on the physical function,
with the NIC's spoof check on (the VF sends from that MAC only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcvm.bootspec import Nic
from hpcvm.errors import UsageError
from hpcvm.host.privilege import for_admin
from hpcvm.nic_models import DEFAULT_NIC_MODEL, VFIO
from hpcvm.runtime.net.base import (
    NetworkRequest,
    NicFds,
    Warn,
    check_subnet,
    fitting_mtu,
    link,
    mac_for,
    parse_address,
    run_ip,
)


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
                + for_admin("create VFs (`echo N > /sys/bus/pci/devices/PF/sriov_numvfs`)")
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
                "interface to set the VF's MAC through: " + for_admin("bind the PF's driver")
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
            f"{', '.join(vfs) or 'none'}; in use: {', '.join(taken) or 'none'}): "
            + for_admin("bind one to vfio-pci (driverctl, or vfio-pci's new_id)")
            + ", or name one with vf=DDDD:BB:DD.F"
        )

    def resolve(
        self, request: NetworkRequest, *, vm: str, index: int, address: str | None, warn: Warn
    ) -> Nic:
        from hpcvm.plan.passthrough import normalise_bdf

        if request.model != DEFAULT_NIC_MODEL:
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
        mtu = fitting_mtu(vf.pf_netdev, int(info["mtu"]), request.mtu)
        iface = parse_address(address) if address is not None else None
        if iface is not None:
            check_subnet(iface, vf.pf_netdev, warn)
        return Nic(
            kind="vf",
            source=bdf,
            model=VFIO,
            mac=mac_for(vm, index, str(iface) if iface is not None else None),
            ifname=vf.pf_netdev,
            address=str(iface) if iface is not None else None,
            mtu=mtu,
        )

    def attach(self, nic: Nic) -> None:
        """The VF's MAC, set on its PF (the guest, still paused, has not probed it), with
        the NIC's spoof check on: the PF's switch then drops every frame the VF sends from
        another source MAC (docs/site.md "What separates users": what it does not check)."""
        vf = self.virtual_function(nic.source)
        run_ip(*spoofchk_command(vf, nic.mac))

    def open(self, nic: Nic, run_dir: Path) -> NicFds | None:
        return None  # a passthrough device of the plan

    def host_link(self, request: NetworkRequest) -> str | None:
        if request.source == "auto":
            return None  # which PF is known only once a VF is chosen
        return self.virtual_function(request.source).pf_netdev

    def release(self, nic: Nic) -> None:
        return None


def spoofchk_command(vf: VirtualFunction, mac: str) -> tuple[str, ...]:
    """``ip`` arguments that give ``vf`` its MAC and turn its spoof check on, in one call
    (nothing runs between the two)."""
    return ("link", "set", "dev", vf.pf_netdev, "vf", str(vf.index), "mac", mac, "spoofchk", "on")


def _vfs_in_use() -> list[str]:
    """The VFs that VMs recorded on this host use (vf=auto must not take them)."""
    from hpcvm.runtime.machine import state

    return [
        nic.source
        for entry in state.list_entries()
        if entry.machine is not None and entry.state != "stale"
        for nic in entry.machine.boot.nics
        if nic.model == VFIO
    ]
