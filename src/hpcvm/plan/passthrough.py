"""PCI passthrough (VFIO) checks: which devices can be given to the guest.

VFIO hands the guest a whole IOMMU group, because devices in one group can reach each
other's memory without the IOMMU seeing it. So every other endpoint of the group must
be passed too; bridges may stay (VFIO accepts groups holding PCI bridges). The device's
NUMA node is where its DMA and interrupts land, so the vCPUs should be there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.host.model import HostTopology, PciDevice
from hpcvm.plan.model import PassthroughDevice
from hpcvm.plan.notes import Notes

_BDF_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{1,4}):)?(?P<bus>[0-9a-f]{1,2}):(?P<dev>[0-9a-f]{1,2})\.(?P<fn>[0-7])$"
)


def normalise_bdf(text: str) -> str:
    """'3b:00.0' -> '0000:3b:00.0' (lower case, domain 0 by default)."""
    match = _BDF_RE.match(text.strip().lower())
    if not match:
        raise UsageError(
            f"--passthrough {text!r} is not a PCI address: use the form 0000:3b:00.0 or 3b:00.0",
            option="passthrough",
        )
    domain = int(match["domain"] or "0", 16)
    return f"{domain:04x}:{int(match['bus'], 16):02x}:{int(match['dev'], 16):02x}.{match['fn']}"


@dataclass(frozen=True)
class CheckedDevice:
    device: PciDevice
    others_passed: tuple[str, ...]  # other requested functions in its IOMMU group


def check_passthrough(host: HostTopology, requested: Sequence[str]) -> list[CheckedDevice]:
    """Validate the requested devices; raise with the reason when one cannot be passed."""
    if not requested:
        return []
    bdfs = [normalise_bdf(b) for b in requested]
    dupes = sorted({b for b in bdfs if bdfs.count(b) > 1})
    if dupes:
        raise UsageError(
            f"--passthrough lists {', '.join(dupes)} more than once", option="passthrough"
        )
    by_bdf = {d.bdf: d for d in host.pci}
    devices = [_find(host, by_bdf, b) for b in bdfs]
    if host.iommu is False:
        raise InfeasiblePlanError(
            "IOMMU is off: boot the host with intel_iommu=on iommu=pt (or amd_iommu=on) "
            "to pass devices through",
            option="passthrough",
        )
    passed = set(bdfs)
    return [_check_group(host, by_bdf, d, passed) for d in devices]


def _find(host: HostTopology, by_bdf: dict[str, PciDevice], bdf: str) -> PciDevice:
    if bdf in by_bdf and not by_bdf[bdf].is_bridge:
        return by_bdf[bdf]
    candidates = [f"{d.bdf} ({d.kind}{', ' + d.name if d.name else ''})" for d in host.pci]
    candidates = [c for c, d in zip(candidates, host.pci, strict=True) if not d.is_bridge]
    listing = "; ".join(candidates) if candidates else "none"
    what = "is a bridge, not a device" if bdf in by_bdf else "is not on this host"
    raise UsageError(
        f"--passthrough {bdf} {what}; passthrough candidates: {listing}", option="passthrough"
    )


def _check_group(
    host: HostTopology, by_bdf: dict[str, PciDevice], device: PciDevice, passed: set[str]
) -> CheckedDevice:
    group = device.iommu_group
    if group is None or group not in host.iommu_groups:
        raise InfeasiblePlanError(
            f"cannot pass {device.bdf} through: the host description has no IOMMU groups "
            "(IOMMU off or not recorded); enable the IOMMU (intel_iommu=on or amd_iommu=on)",
            option="passthrough",
        )
    members = host.iommu_groups[group]
    blockers = [
        m
        for m in members
        if m != device.bdf and m not in passed and not (m in by_bdf and by_bdf[m].is_bridge)
    ]
    if blockers:
        raise InfeasiblePlanError(
            f"cannot pass {device.bdf} through: IOMMU group {group} also holds "
            f"{', '.join(blockers)}, which VFIO would hand to the guest too: pass them as well "
            "(--passthrough) or move the device to a slot with its own group",
            option="passthrough",
        )
    others = tuple(m for m in members if m != device.bdf and m in passed)
    return CheckedDevice(device=device, others_passed=others)


def passthrough_devices(
    checked: Sequence[CheckedDevice], guest_node_of_host: dict[int, int], notes: Notes
) -> tuple[PassthroughDevice, ...]:
    """The plan's devices, each with the guest node mirroring its host node."""
    out = []
    for c in checked:
        d = c.device
        guest = guest_node_of_host.get(d.numa_node) if d.numa_node is not None else None
        out.append(
            PassthroughDevice(
                bdf=d.bdf,
                kind=d.kind,
                host_node=d.numa_node,
                iommu_group=d.iommu_group,
                guest_node=guest,
                group_members=c.others_passed,
            )
        )
        where = (
            f"host node {d.numa_node}, shown in guest node {guest}"
            if guest is not None
            else (
                "its NUMA node is unknown"
                if d.numa_node is None
                else f"host node {d.numa_node}, which holds none of the vCPUs"
            )
        )
        notes.decide(
            "passthrough",
            f"pass {d.bdf} ({d.kind}{' ' + d.name if d.name else ''}) with VFIO: IOMMU group "
            f"{d.iommu_group}, {where}",
        )
        if guest is None and d.numa_node is not None:
            notes.warn(
                f"{d.bdf} sits on host node {d.numa_node} but no vCPU can run there: its DMA "
                "and interrupts cross the interconnect"
            )
    return tuple(out)
