"""A VMPlan (and optionally a BootSpec) as a libvirt domain XML. Pure: no I/O.

The domain describes the same guest as ``qemu_argv`` renders for the same plan: same
topology, NUMA cells, distances, memory backing and binding, devices. Unlike the QEMU
line it also carries the pinning (``cputune``), because libvirt pins the threads itself.
Written for libvirt 9.0 (Debian 12); every rendered domain is checked against
``virt-xml-validate`` and ``virsh define`` in the integration tests.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from hpcvm.bootspec import SHARE_TABLE_FWCFG, BootSpec, share_table
from hpcvm.errors import UsageError
from hpcvm.nic_models import nic_model
from hpcvm.plan.model import VMPlan
from hpcvm.render.checks import check_renderable
from hpcvm.render.qemu import disk_format, passthrough_bdfs
from hpcvm.units import KIB, format_cpu_list

DEFAULT_EMULATOR = "/usr/bin/qemu-system-x86_64"
_BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{1,4}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def libvirt_xml(
    plan: VMPlan, boot: BootSpec | None = None, *, emulator: str = DEFAULT_EMULATOR
) -> str:
    """The domain XML for ``plan``, pretty-printed; with ``boot``, its boot media,
    shared root, agent channel and console log (QMP and the pidfile are libvirt's)."""
    check_renderable(plan)
    boot = boot or BootSpec()
    domain = ET.Element("domain", type=plan.accel if plan.accel == "kvm" else "qemu")
    _sub(domain, "name", plan.name)
    _sub(domain, "memory", str(kib(plan.memory_bytes)), unit="KiB")
    _sub(domain, "currentMemory", str(kib(plan.memory_bytes)), unit="KiB")
    _memory_backing(domain, plan)
    _sub(domain, "vcpu", str(plan.vcpus), placement="static")
    if plan.iothreads:
        _sub(domain, "iothreads", str(plan.iothreads))
    _cputune(domain, plan)
    _numatune(domain, plan)
    _sysinfo(domain, boot)
    _os(domain, boot)
    ET.SubElement(ET.SubElement(domain, "features"), "acpi")
    _cpu(domain, plan)
    _clock(domain, plan)
    _devices(domain, plan, boot, emulator)
    ET.indent(domain, space="  ")
    return ET.tostring(domain, encoding="unicode") + "\n"


def kib(nbytes: int) -> int:
    """libvirt's unit; plans are in bytes and always whole KiB (page multiples)."""
    return nbytes // KIB


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrib: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attrib)
    if text is not None:
        element.text = text
    return element


def _memory_backing(domain: ET.Element, plan: VMPlan) -> None:
    """Huge pages by size, per guest cell (``nodeset`` names guest cells, not host
    nodes), ``allocation immediate`` for prealloc (a short pool fails at start), and
    ``locked`` where the QEMU line has ``mem-lock=on`` (hpc under KVM, see qemu.py)."""
    huge = [r for r in plan.memory if r.backend == "file"]
    prealloc = any(r.prealloc for r in plan.memory)
    locked = plan.profile == "hpc" and plan.accel == "kvm"
    if not (huge or prealloc or locked):
        return
    backing = ET.SubElement(domain, "memoryBacking")
    if huge:
        pages = ET.SubElement(backing, "hugepages")
        for size in sorted({r.page_size_bytes for r in huge}):
            attrs = {"size": str(kib(size)), "unit": "KiB"}
            cells = [r.guest_node for r in huge if r.page_size_bytes == size]
            if plan.guest_nodes:
                attrs["nodeset"] = format_cpu_list([c for c in cells if c is not None])
            ET.SubElement(pages, "page", attrs)
    if locked:
        ET.SubElement(backing, "locked")
    if prealloc:
        ET.SubElement(backing, "allocation", mode="immediate")


def _cputune(domain: ET.Element, plan: VMPlan) -> None:
    """1:1 vCPU pins, and QEMU's emulator and I/O threads on the housekeeping PUs."""
    pins = [(p.vcpu, p.host_pu) for p in plan.placements if p.host_pu is not None]
    if not (pins or plan.emulator_pus or (plan.iothreads and plan.iothread_pus)):
        return
    tune = ET.SubElement(domain, "cputune")
    for vcpu, pu in pins:
        ET.SubElement(tune, "vcpupin", vcpu=str(vcpu), cpuset=str(pu))
    if plan.emulator_pus:
        ET.SubElement(tune, "emulatorpin", cpuset=format_cpu_list(plan.emulator_pus))
    if plan.iothread_pus:
        for ident in range(1, plan.iothreads + 1):
            ET.SubElement(
                tune, "iothreadpin", iothread=str(ident), cpuset=format_cpu_list(plan.iothread_pus)
            )


def _numatune(domain: ET.Element, plan: VMPlan) -> None:
    """``strict`` binding (QEMU's ``policy=bind``): all guest memory on the planned host
    nodes, and each guest cell's memory on its own host node (``memnode``)."""
    bound = [r for r in plan.memory if r.policy == "bind" and r.host_nodes]
    if not bound:
        return
    tune = ET.SubElement(domain, "numatune")
    nodes = sorted({n for r in bound for n in r.host_nodes})
    ET.SubElement(tune, "memory", mode="strict", nodeset=format_cpu_list(nodes))
    for r in bound:
        if r.guest_node is not None:
            ET.SubElement(
                tune,
                "memnode",
                cellid=str(r.guest_node),
                mode="strict",
                nodeset=format_cpu_list(r.host_nodes),
            )


def _os(domain: ET.Element, boot: BootSpec) -> None:
    """q35 like the QEMU line; direct kernel boot when the boot spec has a kernel."""
    os_el = ET.SubElement(domain, "os")
    _sub(os_el, "type", "hvm", arch="x86_64", machine="q35")
    if boot.kernel is not None:
        _sub(os_el, "kernel", boot.kernel)
        if boot.initrd is not None:
            _sub(os_el, "initrd", boot.initrd)
        if boot.cmdline is not None:
            _sub(os_el, "cmdline", boot.cmdline)


def _cpu(domain: ET.Element, plan: VMPlan) -> None:
    """CPU model, topology and NUMA cells with distances. ``host`` is host-passthrough
    with ``migratable='off'`` (nothing filtered, invtsc kept), ``max`` is libvirt's
    ``maximum`` (what TCG can emulate), None keeps QEMU's default model."""
    cpu = ET.SubElement(domain, "cpu")
    model = plan.cpu.model
    if model == "host":
        cpu.attrib.update({"mode": "host-passthrough", "check": "none", "migratable": "off"})
    elif model == "max":
        cpu.attrib.update({"mode": "maximum", "check": "none"})
    elif model is not None:
        cpu.attrib.update({"mode": "custom", "match": "exact", "check": "none"})
        _sub(cpu, "model", model, fallback="forbid")
    t = plan.topology
    ET.SubElement(
        cpu,
        "topology",
        sockets=str(t.sockets),
        dies=str(t.dies),
        cores=str(t.cores),
        threads=str(t.threads),
    )
    for feature in plan.cpu.features:
        ET.SubElement(cpu, "feature", policy="require", name=feature)
    if plan.guest_nodes:
        _numa_cells(cpu, plan)


def _numa_cells(cpu: ET.Element, plan: VMPlan) -> None:
    numa = ET.SubElement(cpu, "numa")
    for node in plan.guest_nodes:
        attrs = {"id": str(node.index), "cpus": format_cpu_list(node.vcpus)}
        if not node.vcpus:
            del attrs["cpus"]  # a CPU-less (memory-only) cell
        attrs.update({"memory": str(kib(node.memory_bytes)), "unit": "KiB"})
        cell = ET.SubElement(numa, "cell", attrs)
        distances = ET.SubElement(cell, "distances")
        for other, value in enumerate(plan.guest_distances[node.index]):
            ET.SubElement(distances, "sibling", id=str(other), value=str(value))


def _clock(domain: ET.Element, plan: VMPlan) -> None:
    """UTC like ``-rtc base=utc``; under KVM kvm-clock explicitly present (it is the
    paravirtual clock the hpc profile relies on). TCG has no kvmclock to ask for."""
    clock = ET.SubElement(domain, "clock", offset="utc")
    if plan.accel == "kvm":
        ET.SubElement(clock, "timer", name="kvmclock", present="yes")


def _devices(domain: ET.Element, plan: VMPlan, boot: BootSpec, emulator: str) -> None:
    """The same devices as the QEMU line, and like ``-nodefaults`` none that libvirt
    would otherwise add (USB controller, balloon): no graphics, no balloon in any
    profile, so every profile and both backends run the same minimal machine."""
    devices = ET.SubElement(domain, "devices")
    _sub(devices, "emulator", emulator)
    _disks(devices, plan, boot)
    _share(devices, boot)
    ET.SubElement(devices, "controller", type="usb", model="none")
    _agent(devices, boot)
    _interfaces(devices, boot)
    _console(devices, boot)
    _hostdevs(devices, plan)
    ET.SubElement(devices, "memballoon", model="none")


def _disks(devices: ET.Element, plan: VMPlan, boot: BootSpec) -> None:
    """Boot disk (qcow2 by suffix) as vda, the NoCloud seed read-only raw as vdb; on
    the planned I/O threads round robin, as in the QEMU line."""
    disks = [d for d in ((boot.disk_image, False), (boot.seed_image, True)) if d[0] is not None]
    for index, (path, readonly) in enumerate(disks):
        assert path is not None
        disk = ET.SubElement(devices, "disk", type="file", device="disk")
        driver = {"name": "qemu", "type": "raw" if readonly else disk_format(path)}
        if plan.iothreads:
            driver["iothread"] = str(index % plan.iothreads + 1)
        ET.SubElement(disk, "driver", driver)
        ET.SubElement(disk, "source", file=path)
        ET.SubElement(disk, "target", dev=f"vd{chr(ord('a') + index)}", bus="virtio")
        if readonly:
            ET.SubElement(disk, "readonly")
        elif index == 0:
            ET.SubElement(disk, "boot", order="1")


def _share(devices: ET.Element, boot: BootSpec) -> None:
    """Each shared directory as a 9p ``<filesystem>`` (``multidevs='remap'`` as in the
    QEMU line), read-only unless the share is writable. ``accessmode='squash'`` is
    ``security_model=none`` there: files are accessed and created as QEMU's user, and
    the chown a guest's root asks for is ignored (``passthrough`` would attempt it and
    fail every write as an unprivileged QEMU)."""
    for share in boot.shares:
        fs = ET.SubElement(
            devices, "filesystem", type="mount", accessmode="squash", multidevs="remap"
        )
        ET.SubElement(fs, "source", dir=share.host_path)
        ET.SubElement(fs, "target", dir=share.tag)
        if not share.writable:
            ET.SubElement(fs, "readonly")


def _sysinfo(domain: ET.Element, boot: BootSpec) -> None:
    """The built-in guest's share table on fw_cfg (``-fw_cfg`` in the QEMU line)."""
    if not boot.share_table:
        return
    sysinfo = ET.SubElement(domain, "sysinfo", type="fwcfg")
    _sub(sysinfo, "entry", share_table(boot), name=SHARE_TABLE_FWCFG)


def _agent(devices: ET.Element, boot: BootSpec) -> None:
    """qemu-guest-agent's virtio-serial port, on a unix socket the runtime connects to,
    and hpcvm's completion port beside it."""
    if boot.agent_socket is None:
        return
    ports = [(boot.agent_socket, boot.agent_port_name)]
    if boot.done_socket is not None:
        ports.append((boot.done_socket, boot.done_port_name))
    for path, name in ports:
        channel = ET.SubElement(devices, "channel", type="unix")
        ET.SubElement(channel, "source", mode="bind", path=path)
        ET.SubElement(channel, "target", type="virtio", name=name)


def _interfaces(devices: ET.Element, boot: BootSpec) -> None:
    """Each NIC as the ``<interface>`` its network kind chose (``Nic.wiring``): a
    bridge's is ``type='bridge'`` with ``<source bridge=...>``, a macvtap's ``'direct'``
    on its parent in bridge mode. libvirt creates the tap or macvtap under the planned
    name, puts it into the bridge with the MTU and removes it with the domain, as the
    QEMU backend does (runtime/net/network.py). ``driver`` says vhost or QEMU's userspace
    datapath for virtio, as ``vhost=on`` does on the QEMU line."""
    for nic in boot.nics:
        if nic.wiring.libvirt_type is None:
            continue  # no interface: a passthrough device of the plan (a <hostdev> below)
        iface = ET.SubElement(devices, "interface", type=nic.wiring.libvirt_type)
        ET.SubElement(iface, "mac", address=nic.mac)
        if nic.wiring.libvirt_source:
            ET.SubElement(iface, "source", dict(nic.wiring.libvirt_source))
        ET.SubElement(iface, "target", dev=nic.ifname)
        model = nic_model(nic.model)
        ET.SubElement(iface, "model", type=model.libvirt_model)
        if model.paravirtual:
            ET.SubElement(iface, "driver", name="vhost" if nic.vhost else "qemu")
        ET.SubElement(iface, "mtu", size=str(nic.mtu))


def _console(devices: ET.Element, boot: BootSpec) -> None:
    """ttyS0 into the console log file, and the console element pointing at it."""
    if boot.serial_log is None:
        return
    serial = ET.SubElement(devices, "serial", type="file")
    ET.SubElement(serial, "source", path=boot.serial_log)
    ET.SubElement(serial, "target", port="0")
    console = ET.SubElement(devices, "console", type="file")
    ET.SubElement(console, "source", path=boot.serial_log)
    ET.SubElement(console, "target", type="serial", port="0")


def _hostdevs(devices: ET.Element, plan: VMPlan) -> None:
    """VFIO passthrough of each device and its IOMMU group's other functions;
    ``managed='yes'`` lets libvirt unbind the host driver and bind vfio-pci."""
    for bdf in passthrough_bdfs(plan):
        dev = ET.SubElement(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
        ET.SubElement(ET.SubElement(dev, "source"), "address", pci_address(bdf))


def pci_address(bdf: str) -> dict[str, str]:
    """``0000:3b:00.1`` (or ``3b:00.1``) as libvirt's address attributes."""
    match = _BDF_RE.match(bdf)
    if match is None:
        raise UsageError(f"malformed PCI address {bdf!r} in the plan: use DDDD:BB:SS.F")
    domain, bus, slot, function = match.groups(default="0")
    return {
        "domain": f"0x{int(domain, 16):04x}",
        "bus": f"0x{int(bus, 16):02x}",
        "slot": f"0x{int(slot, 16):02x}",
        "function": f"0x{int(function, 16):x}",
    }
