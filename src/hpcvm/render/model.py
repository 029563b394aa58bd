"""What the runtime adds to a plan to make it bootable: boot media, the shared root,
the agent channel, sockets and logs. Kept apart from VMPlan because one plan boots in
many ways (built-in guest, a disk image) and renders for targets that boot nothing
(``hpcvm plan --format qemu``)."""

from __future__ import annotations

from hpcvm.model import Frozen


class BootSpec(Frozen):
    """Boot media and runtime endpoints. Every field is optional; the renderers emit
    only what is set. Paths are absolute host paths."""

    kernel: str | None = None
    initrd: str | None = None
    cmdline: str | None = None  # kernel command line (with --kernel only)
    disk_image: str | None = None  # a qcow2/raw disk booted instead of --kernel
    seed_image: str | None = None  # cloud-init NoCloud seed (attached as a second disk)
    share_root: str | None = None  # host directory shared read-only over virtio-9p
    share_tag: str = "hpcvmroot"
    agent_socket: str | None = None  # unix socket for qemu-guest-agent (virtio-serial)
    agent_port_name: str = "org.qemu.guest_agent.0"
    serial_log: str | None = None  # file receiving the guest console (ttyS0)
    qmp_socket: str | None = None  # QMP unix socket (QEMU backend)
    pidfile: str | None = None
    paused: bool = False  # start with vCPUs stopped (-S)
