"""A NIC model registered from outside hpcvm (tests/integration/test_cluster_plugins.py):
one module, one registry call. ``virtio-modern`` is QEMU's virtio NIC without the legacy
interface (``virtio-net-pci-non-transitional``, libvirt's ``virtio-non-transitional``):
the guest's virtio_net drives it, on PCI device id 0x1041 instead of the transitional
0x1000, which is how the test tells from inside the guest that this model runs."""

from __future__ import annotations

from hpcvm.nic_models import NicModelSpec, register_nic_model

register_nic_model(
    NicModelSpec(
        name="virtio-modern",
        qemu_device="virtio-net-pci-non-transitional",
        libvirt_model="virtio-non-transitional",
        guest_driver="virtio_net",
        guest_modules=("virtio_net",),
        paravirtual=True,
    )
)
