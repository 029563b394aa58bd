"""Which PCI functions matter for HPC guests, and where they sit.

Classification follows the PCI class code and hwloc's OS devices: an InfiniBand HCA
may report class 0x0207, the older "serial bus" 0x0c06, or only show up through its
OpenFabrics device (mlx5_0, qib0).
"""

from __future__ import annotations

from hpcvm.host.hwloc import HwPci
from hpcvm.host.model import DeviceKind

# hwloc osdev_type values (hwloc_obj_osdev_type_e)
OSDEV_GPU = 1
OSDEV_OPENFABRICS = 3
OSDEV_COPROC = 5

VENDOR_NVIDIA = 0x10DE
VENDOR_AMD_ATI = 0x1002
VENDOR_INTEL = 0x8086
GPU_VENDORS = frozenset({VENDOR_NVIDIA, VENDOR_AMD_ATI, VENDOR_INTEL})

CLASS_NVME = 0x0108
CLASS_ETHERNET = 0x0200
CLASS_INFINIBAND = 0x0207
CLASS_SERIAL_INFINIBAND = 0x0C06
CLASS_VGA = 0x0300
CLASS_3D = 0x0302
CLASS_DISPLAY_OTHER = 0x0380


def classify(dev: HwPci) -> DeviceKind:
    """ethernet, infiniband, gpu, nvme or other (bridges are "other" with is_bridge)."""
    osdev_types = {t for _, t in dev.os_devices}
    if dev.is_bridge:
        return "other"
    if dev.class_id == CLASS_ETHERNET:  # RoCE/usNIC NICs have verbs devices too
        return "ethernet"
    if dev.class_id in (CLASS_INFINIBAND, CLASS_SERIAL_INFINIBAND) or (
        OSDEV_OPENFABRICS in osdev_types
    ):
        return "infiniband"
    if dev.class_id == CLASS_NVME:
        return "nvme"
    if dev.class_id == CLASS_3D or (
        dev.class_id in (CLASS_VGA, CLASS_DISPLAY_OTHER)
        and (dev.vendor_id in GPU_VENDORS or osdev_types & {OSDEV_GPU, OSDEV_COPROC})
    ):
        return "gpu"
    return "other"


def local_node(dev: HwPci, normal_nodes: list[int]) -> int | None:
    """The device's NUMA node from hwloc's placement: the one normal node in the
    nodeset of the object it hangs from; None when that spans several nodes."""
    local = [n for n in normal_nodes if n in dev.nodeset]
    return local[0] if len(local) == 1 else None
