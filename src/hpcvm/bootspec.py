"""What the runtime adds to a plan to make it bootable: boot media, the directories
shared with the guest, the agent channel, sockets and logs, and how QEMU is confined.
A foundation type below guest/, render/ and runtime/ (all three use it), so guest/ does
not depend on render/. Kept apart from VMPlan because one plan boots in many ways
(built-in guest, a disk image) and renders for targets that boot nothing
(``hpcvm plan --format qemu``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from hpcvm.model import Frozen
from hpcvm.nic_models import DEFAULT_NIC_MODEL, NIC_MODELS, VFIO

SHARE_TABLE_FWCFG = "opt/org.hpcvm/shares"  # fw_cfg entry the built-in guest reads
SANDBOX = (  # QEMU's seccomp filter, everything QEMU 7.2 can deny together with -runas
    ("obsolete", "deny"),
    ("spawn", "deny"),
    ("resourcecontrol", "deny"),
)


class Share(Frozen):
    """One host directory the guest mounts at ``guest_path`` over virtio-9p.

    Read-only shares get a tmpfs overlay in the built-in guest (writes stay in the
    guest); ``hide`` names entries (relative to ``host_path``) the guest must not see:
    the built-in guest whites them out in that overlay before mounting it.
    """

    host_path: str
    guest_path: str
    tag: str  # 9p mount tag (at most 31 bytes)
    writable: bool = False
    hide: tuple[str, ...] = ()


class GuestLink(Frozen):
    """A symbolic link in the built-in guest's root, as on the host (``/bin`` ->
    ``usr/bin`` on a merged-/usr system)."""

    guest_path: str
    target: str


def _known_model(name: str) -> str:
    """A NIC model a record or request may name: a registered one (nic_models.py; a
    plugin's once loaded) or VFIO, refused in pydantic's terms otherwise, so that a
    damaged record is refused where it is read, as with any other field."""
    if name != VFIO and name not in NIC_MODELS:
        raise ValueError(f"unknown NIC model {name!r}: use one of {', '.join(NIC_MODELS)}")
    return name


# A name in nic_models.NIC_MODELS, or nic_models.VFIO for a passed-through VF (no
# emulation): a name checked against the registry, not a Literal, so that a plugin's
# model is one too.
NicModel = Annotated[str, AfterValidator(_known_model)]


class NicWiring(Frozen):
    """How QEMU and libvirt connect a NIC to its host side, as its network kind decided
    (runtime/net/network.py): the renderers read this, never the kind's name, so a kind a
    plugin registers renders like hpcvm's own.

    ``netdev``: QEMU's ``-netdev`` backend (``tap``, ``user``...) with its options
    besides ``id``; None for a NIC that is no emulated device (a VF passed through,
    which the plan renders as a passthrough device). ``fds_from_hpcvm``: the host side
    is made and opened by hpcvm, which hands QEMU descriptors (``fd=``, and ``vhostfd=``
    with vhost-net). ``libvirt_type`` and ``libvirt_source``: the ``<interface
    type=...>`` and the attributes of its ``<source>``; None: no interface (a VF is a
    ``<hostdev>``).
    """

    netdev: str | None = None
    netdev_options: tuple[tuple[str, str], ...] = ()
    fds_from_hpcvm: bool = False
    libvirt_type: str | None = None
    libvirt_source: tuple[tuple[str, str], ...] = ()


class Nic(Frozen):
    """One network interface of the VM, resolved and checked on the host before anything
    starts (runtime/net/network.py). Everything about it is deterministic from the VM's name
    (``mac``, ``ifname``) or read from the host (``mtu``, ``vhost``), so the same
    ``up`` gives the same NIC and a test can predict it.

    ``kind`` names its network kind (runtime/net/network.py ``NETWORK_KINDS``), which also
    made and will release its host side; ``mac`` is the guest's MAC (locally
    administered); ``ifname`` the host-side link (at most 15 characters, never
    ``vir*``: Open MPI skips such names); ``address`` the IPv4 interface the guest gives
    itself at boot (``hpcvm.net=`` on its command line).
    """

    kind: str
    source: str  # the bridge (bridge), parent device (macvtap) or VF's PCI address (vf)
    model: NicModel = DEFAULT_NIC_MODEL
    mac: str
    ifname: str  # vf: the physical function's interface (the VF's MAC is set there)
    address: str | None = None  # "10.77.0.101/24"
    mtu: int
    vhost: bool = False  # /dev/vhost-net exists: the datapath runs in the host kernel
    wiring: NicWiring = NicWiring()
    # Descriptors hpcvm opened for QEMU (macvtap: the tap, then vhost-net's): valid only
    # in the process that starts QEMU, so never recorded (runtime/net/network.py with_fds).
    fds: tuple[int, ...] = Field(default=(), exclude=True)


class BootSpec(Frozen):
    """Boot media and runtime endpoints. Every field is optional; the renderers emit
    only what is set. Paths are absolute host paths."""

    kernel: str | None = None
    initrd: str | None = None
    cmdline: str | None = None  # kernel command line (with --kernel only)
    disk_image: str | None = None  # a qcow2/raw disk booted instead of --kernel
    seed_image: str | None = None  # cloud-init NoCloud seed (attached as a second disk)
    shares: tuple[Share, ...] = ()  # host directories over virtio-9p
    links: tuple[GuestLink, ...] = ()  # symlinks the built-in guest makes in its root
    share_table: bool = False  # pass the share table to the guest (fw_cfg), built-in only
    agent_socket: str | None = None  # unix socket for qemu-guest-agent (virtio-serial)
    agent_port_name: str = "org.qemu.guest_agent.0"
    # hpcvm's own virtio-serial port beside the agent's: a guest process writes a token
    # to it when done, so the host waits instead of polling (runtime/channels/completion.py)
    done_socket: str | None = None
    done_port_name: str = "org.hpcvm.done.0"
    serial_log: str | None = None  # file receiving the guest console (ttyS0)
    qmp_socket: str | None = None  # QMP unix socket (QEMU backend)
    pidfile: str | None = None
    paused: bool = False  # start with vCPUs stopped (-S)
    incoming: bool = (
        False  # wait for a saved state (-incoming defer; runtime/checkpoint/save_restore.py)
    )
    run_as: str | None = None  # QEMU drops to this user once set up (-runas)
    sandbox: bool = False  # QEMU's seccomp sandbox (-sandbox on,...)
    nics: tuple[Nic, ...] = ()  # network interfaces (runtime/net/network.py)


def nic_kernel_arg(nic: Nic) -> str:
    """The built-in guest's command line word for one NIC: ``hpcvm.net=MAC,ADDR,MTU``
    (ADDR empty for a NIC without an address); its rc script finds the interface by MAC
    and configures it (guest/scripts.py)."""
    return f"hpcvm.net={nic.mac},{nic.address or ''},{nic.mtu}"


def share_table(boot: BootSpec) -> str:
    """The text the built-in guest's init reads to build its root (guest/scripts.py).

    One entry per line, in mount order (a parent before what is mounted inside it):
    ``hide TAG RELPATH`` (whiteout in that share's overlay, given before the share),
    ``ro TAG PATH``, ``rw TAG PATH`` and ``link TARGET PATH``. The last field is the rest
    of the line, so paths may hold spaces; newlines are refused where shares are made.
    """
    lines: list[str] = []
    for link in boot.links:
        lines.append(f"link {link.target} {link.guest_path}")
    for share in sorted(boot.shares, key=lambda s: (s.guest_path.count("/"), s.guest_path)):
        lines += [f"hide {share.tag} {rel}" for rel in share.hide]
        lines.append(f"{'rw' if share.writable else 'ro'} {share.tag} {share.guest_path}")
    return "".join(f"{line}\n" for line in lines)
