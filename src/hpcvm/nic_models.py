"""The NIC models a VM's emulated NIC may be (``--network ...,model=``, bench's
``vm:hpc+e1000``): one row per model with all that hpcvm's parts need of it, so that
adding one is one ``register_nic_model`` call (here, or in a plugin: plugins.py), not an
entry in a table of each part.

The renderers take the QEMU device and libvirt's model type from the row, the network
kinds whether vhost-net can carry it, ``verify`` the driver the guest must bind
(``/sys/class/net/IF/device/driver``), the built-in guest the modules its initramfs
carries for it, and bench its variant's name. A passed-through VF (``vfio``) is no
emulated model and has no row: the device is the hardware's own. Free of pydantic:
``--help`` builds its choices from the names.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcvm.errors import UsageError
from hpcvm.registry import Registry

VFIO = "vfio"  # a Nic's model when the NIC is a passed-through VF (runtime/net/vf.py)
DEFAULT_NIC_MODEL = "virtio"  # --network without model=


@dataclass(frozen=True)
class NicModelSpec:
    """What each part of hpcvm needs of one NIC model (module doc)."""

    name: str  # as --network model= and a bench variant (+NAME) say it
    qemu_device: str  # QEMU's -device driver
    libvirt_model: str  # libvirt's <model type=...>
    guest_driver: str  # the guest kernel driver that binds it
    guest_modules: tuple[str, ...]  # what the built-in guest loads for it (deps follow)
    # paravirtual: the guest learns the network's MTU from the device (virtio's
    # host_mtu), and the datapath may run in the host kernel (vhost-net)
    paravirtual: bool = False


NIC_MODELS: Registry[NicModelSpec] = Registry("NIC model")


def register_nic_model(spec: NicModelSpec) -> None:
    if spec.name == VFIO:
        raise UsageError(f"NIC model {VFIO!r} is the passed-through VF's: choose another name")
    NIC_MODELS.register(spec.name, spec)


def nic_model(name: str) -> NicModelSpec:
    """The row of ``name``; a one-line UsageError naming the known ones otherwise (a
    record written with a plugin's model read without that plugin)."""
    return NIC_MODELS.get_or_refuse(name)


register_nic_model(
    NicModelSpec(
        name="virtio",
        qemu_device="virtio-net-pci",
        libvirt_model="virtio",
        guest_driver="virtio_net",
        guest_modules=("virtio_net",),
        paravirtual=True,
    )
)
# The emulated Intel 82540EM: the full-virtualization NIC the studies compare with.
register_nic_model(
    NicModelSpec(
        name="e1000",
        qemu_device="e1000",
        libvirt_model="e1000",
        guest_driver="e1000",
        guest_modules=("e1000",),
    )
)
