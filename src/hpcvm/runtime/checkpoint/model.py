"""What a checkpoint records, and the guest ABI a restore must keep. Pure: no I/O.

A saved VM state only loads into a QEMU that builds the very same virtual machine: the
same machine type, CPU model, vCPU topology, guest NUMA nodes, RAM blocks (by id and
size) and devices in the same order (their PCI slots follow it). Everything else is
the host side and may change at restore: which PUs run the vCPUs, which host nodes and
page size back each RAM block, the housekeeping PUs. ``GuestAbi`` is the first part,
taken from a plan and its boot spec; ``abi_differences`` says, in words, how two differ,
so that a restore is refused with the reason before anything starts.

The RAM blocks and the machine option are read from the plan's own QEMU command line
(render/qemu.py), not re-derived here: whether a flat guest's RAM is QEMU's default
``pc.ram`` or a named backend is the renderer's decision, and the ABI must follow it.
"""

from __future__ import annotations

from hpcvm.bootspec import BootSpec
from hpcvm.model import Frozen
from hpcvm.nic_models import nic_model
from hpcvm.plan.model import CpuTopology, VMPlan
from hpcvm.runtime.machine.options import VmOptions
from hpcvm.units import format_size

CHECKPOINT_SCHEMA_VERSION = 1
MANIFEST = "manifest.json"  # written last; lists every other file with its checksum
PLAN_FILE = "plan.json"
STATE_FILE = "state.bin"  # QEMU's migration stream: RAM and device state
DISK_FILE = "disk.qcow2"  # the disk overlay (disk-image guests)
SEED_FILE = "seed.iso"  # the NoCloud seed (disk-image guests)


class GuestNodeAbi(Frozen):
    """A guest NUMA node as the guest sees it (its host node is host side)."""

    index: int
    vcpus: tuple[int, ...]
    memory_bytes: int


class GuestAbi(Frozen):
    """Everything about a VM that its saved state depends on."""

    machine: str  # QEMU's -machine value as rendered ("q35", "q35,memory-backend=ram")
    accel: str  # kvm or tcg: a TCG state does not load under KVM or back
    cpu: str  # -cpu as rendered ("max", "host,+invtsc"), "qemu64" for QEMU's default
    host_cpu: str = ""  # with -cpu host: the host CPU model the guest was given
    vcpus: int
    topology: CpuTopology
    vcpu_layout: tuple[str, ...]  # per vCPU: "socket S die D core C thread T node N"
    memory_bytes: int
    ram_blocks: tuple[str, ...]  # "ID SIZE" per RAM block ("pc.ram 512M" when unnamed)
    guest_nodes: tuple[GuestNodeAbi, ...]
    guest_distances: tuple[tuple[int, ...], ...]
    devices: tuple[str, ...]  # guest-visible devices, in command-line (PCI) order


class FileEntry(Frozen):
    """One file of a checkpoint directory and what it must hash to."""

    size: int
    sha256: str


class Emulator(Frozen):
    """The QEMU that wrote a state, or the one a restore would start."""

    version: str  # "7.2.22": major.minor.micro
    package: str = ""  # the distribution's build ("Debian 1:7.2+dfsg-7+deb12u18+b3")
    machine_type: str  # what -machine q35 stands for ("pc-q35-7.2")


class BaseImage(Frozen):
    """The user's disk image under the overlay: the overlay is only valid over the
    very same bytes, so a restore checks that the image has not changed since
    (size and modification time; hashing gigabytes at every checkpoint would cost more
    than the checkpoint itself)."""

    path: str
    size: int
    mtime_ns: int


class Manifest(Frozen):
    """The index of a checkpoint directory (``manifest.json``)."""

    schema_version: int = CHECKPOINT_SCHEMA_VERSION
    name: str  # the VM's name when it was saved
    saved_at: float  # time.time() when its state began to be saved (the VM paused)
    hostname: str
    backend: str  # the runtime backend that ran it (runtime/backends/registry.py)
    emulator: Emulator
    abi: GuestAbi
    options: VmOptions  # how it was booted (image, network, shares...), for the restore
    boot: BootSpec  # the boot spec it ran with (its paths are the old run dir's)
    base_image: BaseImage | None = None
    files: dict[str, FileEntry]  # every other file of the directory (plan, state, disk)


def guest_abi(plan: VMPlan, boot: BootSpec) -> GuestAbi:
    """The guest side of ``plan`` booted with ``boot``."""
    from hpcvm.render.qemu import qemu_argv

    argv = qemu_argv(plan)
    cpu = _values(argv, "-cpu")
    return GuestAbi(
        machine=_values(argv, "-machine")[0],
        accel=plan.accel,
        cpu=cpu[0] if cpu else "qemu64",
        host_cpu=plan.host_cpu_model if plan.cpu.model == "host" else "",
        vcpus=plan.vcpus,
        topology=plan.topology,
        vcpu_layout=tuple(
            f"socket {p.socket} die {p.die} core {p.core} thread {p.thread} "
            f"node {'-' if p.guest_node is None else p.guest_node}"
            for p in sorted(plan.placements, key=lambda p: p.vcpu)
        ),
        memory_bytes=plan.memory_bytes,
        ram_blocks=_ram_blocks(argv, plan.memory_bytes),
        guest_nodes=tuple(
            GuestNodeAbi(index=n.index, vcpus=n.vcpus, memory_bytes=n.memory_bytes)
            for n in plan.guest_nodes
        ),
        guest_distances=plan.guest_distances,
        devices=guest_devices(plan, boot),
    )


def _values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == option]


def _ram_blocks(argv: list[str], memory_bytes: int) -> tuple[str, ...]:
    """Each memory backend's id and size, or QEMU's default block for plain RAM."""
    blocks: list[str] = []
    for value in _values(argv, "-object"):
        head, _, rest = value.partition(",")
        if not head.startswith("memory-backend-"):
            continue
        fields = dict(part.partition("=")[::2] for part in rest.split(","))
        blocks.append(f"{fields.get('id', '?')} {fields.get('size', '?')}")
    return tuple(blocks) or (f"pc.ram {format_size(memory_bytes)}",)


def guest_devices(plan: VMPlan, boot: BootSpec) -> tuple[str, ...]:
    """The devices the guest sees, in the order render/qemu.py adds them (which fixes
    their PCI slots): passed-through functions, disks, 9p shares, the agent's
    virtio-serial port, NICs. Host-side details (files, sockets, taps, I/O threads)
    are left out: they may differ at restore."""
    from hpcvm.render.qemu import passthrough_bdfs

    devices = [f"vfio-pci {bdf}" for bdf in passthrough_bdfs(plan)]
    if boot.disk_image is not None:
        devices.append("virtio-blk disk0")
    if boot.seed_image is not None:
        devices.append("virtio-blk seed0 read-only")
    devices += [
        f"virtio-9p {s.tag} {'read-write' if s.writable else 'read-only'}" for s in boot.shares
    ]
    devices.append(f"virtio-serial port {boot.agent_port_name}")
    devices += [
        f"{nic_model(nic.model).qemu_device} mac {nic.mac} mtu {nic.mtu}"
        for nic in boot.nics
        if nic.wiring.netdev is not None
    ]
    return tuple(devices)


_LABELS = {
    "machine": "machine type",
    "accel": "accelerator",
    "cpu": "CPU model",
    "host_cpu": "host CPU model (-cpu host)",
    "vcpus": "vCPUs",
    "topology": "vCPU topology",
    "vcpu_layout": "vCPU layout",
    "memory_bytes": "memory",
    "ram_blocks": "RAM blocks",
    "guest_nodes": "guest NUMA nodes",
    "guest_distances": "guest NUMA distances",
    "devices": "devices",
}


def abi_differences(saved: GuestAbi, here: GuestAbi) -> list[str]:
    """One phrase per field in which ``here`` (a restore's plan) differs from
    ``saved`` (the checkpoint's), in GuestAbi's field order; empty when equal."""
    out: list[str] = []
    for field in GuestAbi.model_fields:
        old, new = getattr(saved, field), getattr(here, field)
        if old != new:
            out.append(f"{_LABELS[field]}: saved {_show(field, old)}, here {_show(field, new)}")
    return out


def _show(field: str, value: object) -> str:
    if field == "memory_bytes" and isinstance(value, int):
        return format_size(value)
    if isinstance(value, CpuTopology):
        return f"{value.sockets}s x {value.dies}d x {value.cores}c x {value.threads}t"
    if field == "guest_nodes" and isinstance(value, tuple):
        nodes = [f"{n.index}: vCPUs {list(n.vcpus)} {format_size(n.memory_bytes)}" for n in value]
        return "[" + "; ".join(nodes) + "]" if nodes else "none (flat)"
    if isinstance(value, tuple):
        return "[" + "; ".join(str(v) for v in value) + "]"
    return str(value) or "-"
