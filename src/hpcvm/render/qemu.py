"""A VMPlan (and optionally a BootSpec) as a QEMU command line. Pure: no I/O.

The output is deterministic: the same plan gives the same argv, option for option, so a
plan's command line can be diffed, stored and compared with what a running QEMU reports.
It targets QEMU 7.2 (Debian 12) and later; each group below says why it is there.

What QEMU's command line cannot say is left to the runtime: pinning vCPU, emulator and
I/O threads to host PUs (thread ids come from QMP after start). The process is not
daemonized (no ``-daemonize``): the runtime starts and supervises QEMU as its child, so it
sees QEMU's exit code and stderr when a boot fails.
"""

from __future__ import annotations

import shlex

from hpcvm.bootspec import SANDBOX, SHARE_TABLE_FWCFG, BootSpec, Nic, share_table
from hpcvm.errors import UsageError
from hpcvm.nic_models import nic_model
from hpcvm.plan.model import MemoryRegion, VMPlan
from hpcvm.render.checks import check_renderable
from hpcvm.units import format_size

Args = list[str]

DEFAULT_BINARY = "qemu-system-x86_64"


def qemu_argv(
    plan: VMPlan, boot: BootSpec | None = None, *, binary: str = DEFAULT_BINARY
) -> list[str]:
    """The argv that starts ``plan`` (``binary`` first). With ``boot``, also its boot
    media, shared root, agent channel, console log, QMP socket, pidfile and ``-S``."""
    check_renderable(plan)
    argv = [binary]
    for group in (
        _name,
        _machine,
        _accel,
        _cpu,
        _smp,
        _memory,
        _numa,
        _iothreads,
        _passthrough,
        _hygiene,
        _clock,
        _mem_lock,
    ):
        argv += group(plan)
    if boot is not None:
        argv += _boot(plan, boot)
    return argv


def qemu_command_line(
    plan: VMPlan, boot: BootSpec | None = None, *, binary: str = DEFAULT_BINARY
) -> str:
    """``qemu_argv`` as one shell-quoted line (``shlex.split`` gives the argv back)."""
    return shlex.join(qemu_argv(plan, boot, binary=binary))


# --- QEMU option syntax ---------------------------------------------------------------


def opt_value(value: str) -> str:
    """Escape a value for QEMU's ``key=value,...`` syntax, where a comma is doubled."""
    return value.replace(",", ",,")


def opts(head: str, *pairs: tuple[str, str | int]) -> str:
    """``head,key=value,...`` with values escaped; an empty head gives ``key=value,...``."""
    parts = [head] if head else []
    parts += [f"{key}={opt_value(str(value))}" for key, value in pairs]
    return ",".join(parts)


def on_off(flag: bool) -> str:
    return "on" if flag else "off"


# --- the VM itself --------------------------------------------------------------------


def _name(plan: VMPlan) -> Args:
    """``-name guest=...,debug-threads=on``: the name shows in ``ps`` and QMP, and
    debug-threads names QEMU's threads ("CPU 0/TCG", "IO iothread1"), so the runtime and
    ``verify`` can tell vCPU, I/O and emulator threads apart in /proc."""
    return ["-name", opts("", ("guest", plan.name), ("debug-threads", "on"))]


def _flat_backend(plan: VMPlan) -> MemoryRegion | None:
    """The one region of a flat guest when it needs an explicit backend (huge pages,
    binding, prealloc). A plain anonymous region is QEMU's default RAM: no backend, so a
    ``naive`` line looks exactly like a default one."""
    if plan.guest_nodes or not plan.memory:
        return None
    (region,) = plan.memory
    plain = (
        region.backend == "ram"
        and not region.host_nodes
        and region.policy == "default"
        and not region.prealloc
    )
    return None if plain else region


def _machine(plan: VMPlan) -> Args:
    """``-machine q35``: PCIe, the machine every current guest and libvirt uses. A flat
    guest with a backend gets it as ``memory-backend=`` (the 7.x way to back main RAM)."""
    region = _flat_backend(plan)
    if region is None:
        return ["-machine", "q35"]
    return ["-machine", opts("q35", ("memory-backend", region.id))]


def _accel(plan: VMPlan) -> Args:
    """``-accel``: KVM, or TCG with one host thread per vCPU (``thread=multi``) so that
    vCPU threads exist to pin and the guest's CPUs run in parallel."""
    if plan.accel == "kvm":
        return ["-accel", "kvm"]
    return ["-accel", opts("tcg", ("thread", "multi"))]


def _cpu(plan: VMPlan) -> Args:
    """``-cpu model,+feature...``; omitted when the plan keeps QEMU's default (qemu64),
    as the naive profile does. ``host`` passes the host CPU through (KVM), ``max`` is
    everything TCG can emulate; ``+invtsc`` lets the guest trust the TSC as clocksource."""
    if plan.cpu.model is None:
        return []
    return ["-cpu", ",".join([plan.cpu.model, *(f"+{f}" for f in plan.cpu.features)])]


def _smp(plan: VMPlan) -> Args:
    """``-smp``: the planned sockets/dies/cores/threads, so that the guest's topology
    agrees with what is pinned (siblings appear as threads only when pinned to siblings).
    The naive profile with QEMU's own default shape (one socket of N cores, 7.x) gets a
    plain ``-smp N``, which is what a naive user types."""
    t = plan.topology
    default_shape = (t.sockets, t.dies, t.threads) == (1, 1, 1)
    if plan.profile == "naive" and default_shape:
        return ["-smp", str(plan.vcpus)]
    return [
        "-smp",
        opts(
            str(plan.vcpus),
            ("sockets", t.sockets),
            ("dies", t.dies),
            ("cores", t.cores),
            ("threads", t.threads),
        ),
    ]


def _memory(plan: VMPlan) -> Args:
    """``-m`` total (QEMU 7.2 requires it to equal the sum of the node backends) and one
    ``-object memory-backend-*`` per planned region (none for plain flat RAM)."""
    argv = ["-m", format_size(plan.memory_bytes)]
    regions = plan.memory if plan.guest_nodes else tuple(filter(None, [_flat_backend(plan)]))
    for region in regions:
        argv += ["-object", memory_backend(region)]
    return argv


def memory_backend(region: MemoryRegion) -> str:
    """One backend: hugetlbfs (``memory-backend-file`` at the pool's mount) or anonymous
    (``memory-backend-ram``). ``host-nodes``/``policy=bind`` make the kernel allocate it
    on the planned host node only (fail rather than spill to a remote node); ``prealloc``
    takes all pages at start, so a short pool fails at start and not mid-benchmark."""
    if region.backend == "file":
        assert region.mem_path is not None  # check_renderable
        head = opts("memory-backend-file", ("id", region.id))
        pairs: list[tuple[str, str | int]] = [
            ("size", format_size(region.size_bytes)),
            ("mem-path", region.mem_path),
        ]
    else:
        head = opts("memory-backend-ram", ("id", region.id))
        pairs = [("size", format_size(region.size_bytes))]
    if region.prealloc:
        pairs.append(("prealloc", "on"))
    pairs += [("host-nodes", node) for node in region.host_nodes]
    if region.host_nodes or region.policy != "default":
        pairs.append(("policy", region.policy))
    return opts(head, *pairs)


def _numa(plan: VMPlan) -> Args:
    """Guest NUMA: one ``-numa node`` per guest node on its backend, one ``-numa cpu``
    per vCPU by socket/core/thread (not the deprecated ``cpus=`` ranges), and the
    distances. Nothing for a flat guest."""
    argv: Args = []
    for node in plan.guest_nodes:
        region = next(r for r in plan.memory if r.guest_node == node.index)
        argv += ["-numa", opts("node", ("nodeid", node.index), ("memdev", region.id))]
    if plan.guest_nodes:
        argv += _numa_cpus(plan)
    argv += _numa_distances(plan)
    return argv


def _numa_cpus(plan: VMPlan) -> Args:
    """``die-id`` only with several dies: QEMU x86 rejects it otherwise."""
    argv: Args = []
    for p in plan.placements:
        assert p.guest_node is not None  # check_renderable
        pairs: list[tuple[str, str | int]] = [("node-id", p.guest_node), ("socket-id", p.socket)]
        if plan.topology.dies > 1:
            pairs.append(("die-id", p.die))
        pairs += [("core-id", p.core), ("thread-id", p.thread)]
        argv += ["-numa", opts("cpu", *pairs)]
    return argv


def _numa_distances(plan: VMPlan) -> Args:
    """``-numa dist`` for every pair i<j; QEMU mirrors a symmetric matrix itself, and the
    local distance is fixed at 10 (QEMU rejects anything else), so neither is emitted.
    An asymmetric matrix needs both directions, which QEMU then requires for all pairs."""
    d = plan.guest_distances
    n = len(d)
    symmetric = all(d[i][j] == d[j][i] for i in range(n) for j in range(n))
    pairs = [(i, j) for i in range(n) for j in range(n) if i < j or (i > j and not symmetric)]
    argv: Args = []
    for i, j in pairs:
        argv += ["-numa", opts("dist", ("src", i), ("dst", j), ("val", d[i][j]))]
    return argv


def _iothreads(plan: VMPlan) -> Args:
    """``-object iothread`` per planned I/O thread, named iothread1.. like libvirt's, so
    the runtime pins them by the same names (QMP query-iothreads) on both backends."""
    argv: Args = []
    for ident in iothread_ids(plan):
        argv += ["-object", opts("iothread", ("id", ident))]
    return argv


def iothread_ids(plan: VMPlan) -> list[str]:
    return [f"iothread{i}" for i in range(1, plan.iothreads + 1)]


def _passthrough(plan: VMPlan) -> Args:
    """``-device vfio-pci`` for each passed device and the other functions of its IOMMU
    group (VFIO hands over a whole group or nothing), each once, in plan order."""
    argv: Args = []
    for bdf in passthrough_bdfs(plan):
        argv += ["-device", opts("vfio-pci", ("host", bdf))]
    return argv


def passthrough_bdfs(plan: VMPlan) -> list[str]:
    seen: list[str] = []
    for dev in plan.passthrough:
        for bdf in (dev.bdf, *dev.group_members):
            if bdf not in seen:
                seen.append(bdf)
    return seen


def _hygiene(plan: VMPlan) -> Args:
    """No default devices (NIC, VGA, floppy, CD, monitor), no /etc config, no display:
    every profile gets the same minimal machine, so profiles differ only in what the
    plan changes, and nothing the plan did not ask for takes interrupts or CPU."""
    return ["-nodefaults", "-no-user-config", "-display", "none"]


def _clock(plan: VMPlan) -> Args:
    """``-rtc base=utc,clock=host``: QEMU's defaults, spelled out to match libvirt's
    ``<clock offset='utc'>``; the guest's clocksource (kvm-clock, TSC) follows the CPU."""
    return ["-rtc", opts("", ("base", "utc"), ("clock", "host"))]


def _mem_lock(plan: VMPlan) -> Args:
    """``-overcommit mem-lock=on`` for ``hpc`` under KVM only: it mlockall()s QEMU, so
    no page of QEMU's own (device state, page tables, I/O buffers) is swapped out and
    faulted back on the vCPU's path. Guest RAM on hugetlbfs is never swapped anyway.
    Not under TCG: the lock would fault in and pin TCG's 1 GiB translation cache per
    VM, and emulation, not paging, dominates there."""
    if plan.profile == "hpc" and plan.accel == "kvm":
        return ["-overcommit", opts("", ("mem-lock", "on"))]
    return []


# --- boot media and runtime endpoints -------------------------------------------------


def _boot(plan: VMPlan, boot: BootSpec) -> Args:
    argv: Args = []
    for group in (_kernel, _disks, _share, _agent, _nics, _console, _control, _confine):
        argv += group(plan, boot)
    return argv


def _kernel(plan: VMPlan, boot: BootSpec) -> Args:
    """Direct kernel boot (the built-in guest): no firmware boot menu, no disk."""
    if boot.kernel is None:
        return []
    argv = ["-kernel", boot.kernel]
    if boot.initrd is not None:
        argv += ["-initrd", boot.initrd]
    if boot.cmdline is not None:
        argv += ["-append", boot.cmdline]
    return argv


def disk_format(path: str) -> str:
    """qcow2 by suffix, otherwise raw (no probing: the renderer reads no files, and
    QEMU refuses to guess a raw image's format for safety anyway)."""
    return "qcow2" if path.lower().endswith(".qcow2") else "raw"


def _disks(plan: VMPlan, boot: BootSpec) -> Args:
    """The disk image (boot disk) and the NoCloud seed (raw, read-only), each as
    ``-drive if=none`` plus an explicit ``virtio-blk-pci``, which is what lets the
    device run on a planned I/O thread (``if=virtio`` cannot say ``iothread=``). Device
    ids (virtio-disk0, virtio-seed0, as libvirt names them) make them findable in QOM.
    The writable disk is held open read-write from the start (``auto-read-only=off``):
    otherwise QEMU reopens it by path when a checkpoint hands the disk over and when a
    restore or ``cont`` takes it back, which a QEMU that dropped to its own user
    (``-runas``) may not do in hpcvm's private run dir (measured, QEMU 7.2:
    "bdrv_inactivate_all() failed"; runtime/checkpoint/qemu_state.py)."""
    disks = [("disk0", boot.disk_image, False), ("seed0", boot.seed_image, True)]
    iothreads = iothread_ids(plan)
    argv: Args = []
    for index, (ident, path, readonly) in enumerate(d for d in disks if d[1] is not None):
        assert path is not None
        fmt = "raw" if readonly else disk_format(path)
        drive = [("file", path), ("if", "none"), ("id", ident), ("format", fmt)]
        drive.append(("readonly", "on") if readonly else ("auto-read-only", "off"))
        device: list[tuple[str, str | int]] = [("drive", ident), ("id", f"virtio-{ident}")]
        if ident == "disk0":
            device.append(("bootindex", 0))
        if iothreads:
            device.append(("iothread", iothreads[index % len(iothreads)]))
        argv += ["-drive", opts("", *drive), "-device", opts("virtio-blk-pci", *device)]
    return argv


def _share(plan: VMPlan, boot: BootSpec) -> Args:
    """Each shared host directory over virtio-9p (read-only unless the share is
    writable), and for the built-in guest the share table on fw_cfg, where its init
    reads what to mount where (render/model.py ``share_table``). ``multidevs=remap``
    keeps inode numbers unique when a directory spans several host file systems;
    ``security_model=none`` reads and writes files as QEMU's own (unprivileged) user,
    so the host's permissions decide what the guest can reach."""
    argv: Args = []
    for index, share in enumerate(boot.shares):
        fsdev_id = f"fs{index}"
        pairs: list[tuple[str, str | int]] = [
            ("id", fsdev_id),
            ("path", share.host_path),
            ("security_model", "none"),
        ]
        if not share.writable:
            pairs.append(("readonly", "on"))
        pairs.append(("multidevs", "remap"))
        device = opts("virtio-9p-pci", ("fsdev", fsdev_id), ("mount_tag", share.tag))
        argv += ["-fsdev", opts("local", *pairs), "-device", device]
    if boot.share_table:
        table = opts("", ("name", SHARE_TABLE_FWCFG), ("string", share_table(boot)))
        argv += ["-fw_cfg", table]
    return argv


def _agent(plan: VMPlan, boot: BootSpec) -> Args:
    """qemu-guest-agent's virtio-serial port on a unix socket the runtime connects to,
    and hpcvm's completion port on the same bus; ``wait=off`` so QEMU starts without a
    client."""
    if boot.agent_socket is None:
        return []
    argv: Args = []
    ports = [("qga0", boot.agent_socket, boot.agent_port_name)]
    if boot.done_socket is not None:
        ports.append(("done0", boot.done_socket, boot.done_port_name))
    for ident, path, _name in ports:
        chardev = opts("socket", ("id", ident), ("path", path), ("server", "on"), ("wait", "off"))
        argv += ["-chardev", chardev]
    argv += ["-device", opts("virtio-serial-pci", ("id", "vser0"))]
    for ident, _path, name in ports:
        argv += ["-device", opts("virtserialport", ("chardev", ident), ("name", name))]
    return argv


def _nics(plan: VMPlan, boot: BootSpec) -> Args:
    """Each NIC as the netdev its network kind chose (``Nic.wiring``) and its device
    (nothing without NICs, so every other line is unchanged). A bridge's tap, for
    example, is ``tap,ifname=...,script=no,downscript=no[,vhost=on]``: QEMU opens
    (creates) the tap hpcvm named and later puts in the bridge, no helper script runs
    (the sandbox denies spawning anyway), and vhost moves the virtio datapath into the
    host kernel. ``host_mtu`` tells a virtio guest the network's MTU (VIRTIO_NET_F_MTU);
    e1000, the emulated NIC of the studies' comparison, has no such field and gets its
    MTU from the guest's command line like every NIC."""
    argv: Args = []
    for index, nic in enumerate(boot.nics):
        if nic.wiring.netdev is None:
            continue  # no emulated NIC: a passthrough device of the plan (vfio-pci above)
        argv += ["-netdev", netdev(nic, index), "-device", nic_device(nic, index)]
    return argv


def netdev(nic: Nic, index: int) -> str:
    """The NIC's ``-netdev``: its kind's backend and options, plus the descriptors hpcvm
    opened where the kind has hpcvm open the host side (a macvtap: QEMU cannot open one
    by name)."""
    wiring = nic.wiring
    assert wiring.netdev is not None
    pairs: list[tuple[str, str | int]] = [("id", f"net{index}"), *wiring.netdev_options]
    if wiring.fds_from_hpcvm:
        if not nic.fds:
            raise UsageError(
                f"a {nic.kind} NIC ({nic.ifname} on {nic.source}) is opened by `hpcvm up`, "
                "which passes its descriptor to QEMU: start it with hpcvm up, or use bridge="
            )
        pairs.append(("fd", nic.fds[0]))
        if len(nic.fds) > 1:
            pairs += [("vhost", "on"), ("vhostfd", nic.fds[1])]
    return opts(wiring.netdev, *pairs)


def nic_device(nic: Nic, index: int) -> str:
    pairs: list[tuple[str, str | int]] = [
        ("netdev", f"net{index}"),
        ("id", f"nic{index}"),
        ("mac", nic.mac),
    ]
    model = nic_model(nic.model)
    if model.paravirtual:
        pairs.append(("host_mtu", nic.mtu))
    return opts(model.qemu_device, *pairs)


def _console(plan: VMPlan, boot: BootSpec) -> Args:
    """The guest's ttyS0 into a log file, so a failed boot can be shown to the user."""
    if boot.serial_log is None:
        return []
    chardev = opts("file", ("id", "serial0"), ("path", boot.serial_log))
    return ["-chardev", chardev, "-serial", "chardev:serial0"]


def _control(plan: VMPlan, boot: BootSpec) -> Args:
    """QMP on a unix socket (the runtime's control channel), the pidfile, ``-S`` to
    start with vCPUs stopped (pin first, then ``cont``), and ``-incoming defer`` for a
    restore: QEMU waits for the saved state, handed over QMP (runtime/checkpoint/qemu_state.py)."""
    argv: Args = []
    if boot.qmp_socket is not None:
        qmp = opts(f"unix:{opt_value(boot.qmp_socket)}", ("server", "on"), ("wait", "off"))
        argv += ["-qmp", qmp]
    if boot.pidfile is not None:
        argv += ["-pidfile", boot.pidfile]
    if boot.paused:
        argv.append("-S")
    if boot.incoming:
        argv += ["-incoming", "defer"]
    return argv


def _confine(plan: VMPlan, boot: BootSpec) -> Args:
    """``-runas USER``: QEMU opens what needs root (hugetlbfs files, /dev/kvm, VFIO
    groups, sockets, the shares' roots) and then drops to an unprivileged user before
    the guest runs. ``-sandbox on,...``: QEMU's seccomp filter, denying obsolete system
    calls, spawning processes and changing scheduling or resource limits (hpcvm pins
    QEMU's threads from outside). QEMU 7.2 installs the filter before ``-runas`` takes
    effect, so ``elevateprivileges=deny`` would kill QEMU at its own setuid (measured);
    once it has dropped every uid, the kernel refuses to give root back anyway."""
    argv: Args = []
    if boot.run_as is not None:
        argv += ["-runas", boot.run_as]
    if boot.sandbox:
        argv += ["-sandbox", opts("on", *SANDBOX)]
    return argv
