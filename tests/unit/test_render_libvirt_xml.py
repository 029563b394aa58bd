"""libvirt_xml on hand-built plans: the domain, parsed back, equals the plan."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from hpcvm.bootspec import SHARE_TABLE_FWCFG, Share, share_table
from hpcvm.errors import UsageError
from hpcvm.plan.model import VMPlan
from hpcvm.render import BootSpec, libvirt_xml
from hpcvm.units import parse_cpu_list
from tests import render_plans as plans

ALL = plans.all_plans()
IDS = sorted(ALL)


@pytest.fixture(params=IDS)
def plan(request: pytest.FixtureRequest) -> VMPlan:
    return ALL[str(request.param)]


def _dom(plan: VMPlan, boot: BootSpec | None = None) -> ET.Element:
    return ET.fromstring(libvirt_xml(plan, boot))


def _kib(element: ET.Element | None) -> int:
    assert element is not None
    assert element.get("unit") == "KiB"
    text = element.get("memory") if element.tag == "cell" else element.text
    return int(text or 0)


def _one(root: ET.Element, path: str) -> ET.Element:
    found = root.findall(path)
    assert len(found) == 1, f"{path}: {len(found)} elements"
    return found[0]


def test_domain_basics(plan: VMPlan) -> None:
    text = libvirt_xml(plan)
    assert text == libvirt_xml(plan)  # deterministic
    assert "\n  <name>" in text  # pretty-printed
    dom = ET.fromstring(text)
    assert dom.tag == "domain"
    assert dom.get("type") == ("kvm" if plan.accel == "kvm" else "qemu")
    assert _one(dom, "name").text == plan.name
    assert _kib(dom.find("memory")) * 1024 == plan.memory_bytes
    assert _kib(dom.find("currentMemory")) * 1024 == plan.memory_bytes
    vcpu = _one(dom, "vcpu")
    assert (vcpu.text, vcpu.get("placement")) == (str(plan.vcpus), "static")
    os_type = _one(dom, "os/type")
    assert (os_type.text, os_type.get("machine")) == ("hvm", "q35")
    assert dom.find("features/acpi") is not None
    assert _one(dom, "devices/emulator").text == "/usr/bin/qemu-system-x86_64"
    assert dom.find("devices/graphics") is None
    assert _one(dom, "devices/memballoon").get("model") == "none"


def test_vcpu_pins_equal_placements(plan: VMPlan) -> None:
    dom = _dom(plan)
    pins = {int(p.get("vcpu") or -1): p.get("cpuset") for p in dom.findall("cputune/vcpupin")}
    expected = {p.vcpu: str(p.host_pu) for p in plan.placements if p.host_pu is not None}
    assert pins == expected


def test_emulator_and_iothread_pins(plan: VMPlan) -> None:
    dom = _dom(plan)
    emulator = dom.findall("cputune/emulatorpin")
    if plan.emulator_pus:
        assert sorted(parse_cpu_list(emulator[0].get("cpuset") or "")) == sorted(plan.emulator_pus)
    else:
        assert emulator == []
    iothreads = dom.find("iothreads")
    assert (int(iothreads.text or 0) if iothreads is not None else 0) == plan.iothreads
    pins = dom.findall("cputune/iothreadpin")
    assert [int(p.get("iothread") or 0) for p in pins] == (
        list(range(1, plan.iothreads + 1)) if plan.iothread_pus else []
    )
    for pin in pins:
        assert sorted(parse_cpu_list(pin.get("cpuset") or "")) == sorted(plan.iothread_pus)


def test_numatune_binds_each_cell(plan: VMPlan) -> None:
    dom = _dom(plan)
    bound = [r for r in plan.memory if r.policy == "bind"]
    if not bound:
        assert dom.find("numatune") is None
        return
    memory = _one(dom, "numatune/memory")
    assert memory.get("mode") == "strict"
    assert set(parse_cpu_list(memory.get("nodeset") or "")) == {
        n for r in bound for n in r.host_nodes
    }
    memnodes = {
        int(m.get("cellid") or -1): (m.get("mode"), parse_cpu_list(m.get("nodeset") or ""))
        for m in dom.findall("numatune/memnode")
    }
    assert memnodes == {r.guest_node: ("strict", list(r.host_nodes)) for r in bound}


def test_hugepages_per_cell(plan: VMPlan) -> None:
    dom = _dom(plan)
    huge = [r for r in plan.memory if r.backend == "file"]
    pages = dom.findall("memoryBacking/hugepages/page")
    if not huge:
        assert pages == []
        return
    (page,) = pages  # every plan uses one page size
    assert (page.get("unit"), int(page.get("size") or 0) * 1024) == ("KiB", huge[0].page_size_bytes)
    if plan.guest_nodes:
        assert parse_cpu_list(page.get("nodeset") or "") == [r.guest_node for r in huge]
    else:
        assert page.get("nodeset") is None
    allocation = dom.find("memoryBacking/allocation")
    assert allocation is not None and allocation.get("mode") == "immediate"


def test_cells_and_distances(plan: VMPlan) -> None:
    dom = _dom(plan)
    cells = dom.findall("cpu/numa/cell")
    assert len(cells) == len(plan.guest_nodes)
    matrix = []
    for cell, node in zip(cells, plan.guest_nodes, strict=True):
        assert int(cell.get("id") or -1) == node.index
        assert parse_cpu_list(cell.get("cpus") or "") == list(node.vcpus)
        assert _kib(cell) * 1024 == node.memory_bytes
        siblings = cell.findall("distances/sibling")
        assert [int(s.get("id") or -1) for s in siblings] == list(range(len(cells)))
        matrix.append(tuple(int(s.get("value") or 0) for s in siblings))
    assert tuple(matrix) == plan.guest_distances
    assert sum(node.memory_bytes for node in plan.guest_nodes) in (0, plan.memory_bytes)


def test_cpu_mode_topology_features(plan: VMPlan) -> None:
    cpu = _one(_dom(plan), "cpu")
    mode = {None: None, "host": "host-passthrough", "max": "maximum"}[plan.cpu.model]
    assert cpu.get("mode") == mode
    topo = _one(cpu, "topology")
    t = plan.topology
    assert [int(topo.get(k) or 0) for k in ("sockets", "dies", "cores", "threads")] == [
        t.sockets,
        t.dies,
        t.cores,
        t.threads,
    ]
    features = [(f.get("name"), f.get("policy")) for f in cpu.findall("feature")]
    assert features == [(f, "require") for f in plan.cpu.features]


def test_clock_and_lock_follow_accel(plan: VMPlan) -> None:
    dom = _dom(plan)
    clock = _one(dom, "clock")
    assert clock.get("offset") == "utc"
    timers = [t.get("name") for t in clock.findall("timer")]
    assert timers == (["kvmclock"] if plan.accel == "kvm" else [])
    locked = dom.find("memoryBacking/locked") is not None
    assert locked == (plan.profile == "hpc" and plan.accel == "kvm")


def test_hostdevs_for_passthrough() -> None:
    dom = _dom(plans.hpc_kvm())
    addrs = []
    for dev in dom.findall("devices/hostdev"):
        assert (dev.get("mode"), dev.get("type"), dev.get("managed")) == ("subsystem", "pci", "yes")
        a = _one(dev, "source/address")
        addrs.append(tuple(a.get(k) for k in ("domain", "bus", "slot", "function")))
    assert addrs == [("0x0000", "0x3b", "0x00", "0x0"), ("0x0000", "0x3b", "0x00", "0x1")]
    assert _dom(plans.hpc_tcg()).find("devices/hostdev") is None


def test_malformed_bdf_is_a_usage_error() -> None:
    plan = plans.hpc_kvm()
    dev = plan.passthrough[0].model_copy(update={"bdf": "3b:0.0.0"})
    with pytest.raises(UsageError, match="PCI address"):
        libvirt_xml(plan.model_copy(update={"passthrough": (dev,)}))


def test_boot_spec_devices() -> None:
    boot = BootSpec(
        kernel="/k/vmlinuz",
        initrd="/k/initrd",
        cmdline="console=ttyS0 quiet",
        shares=(
            Share(host_path="/usr", guest_path="/usr", tag="hpcvm0"),
            Share(host_path="/srv/d", guest_path="/d", tag="hpcvm1", writable=True),
        ),
        share_table=True,
        agent_socket="/run/x/qga.sock",
        serial_log="/run/x/console.log",
        qmp_socket="/run/x/qmp.sock",  # libvirt's own: not in the XML
    )
    dom = _dom(plans.numa(), boot)
    assert [_one(dom, f"os/{k}").text for k in ("kernel", "initrd", "cmdline")] == [
        boot.kernel,
        boot.initrd,
        boot.cmdline,
    ]
    filesystems = dom.findall("devices/filesystem")
    assert {(f.get("type"), f.get("accessmode"), f.get("multidevs")) for f in filesystems} == {
        ("mount", "squash", "remap")  # security_model=none, as in the QEMU line
    }
    assert [
        (_one(f, "source").get("dir"), _one(f, "target").get("dir"), f.find("readonly") is not None)
        for f in filesystems
    ] == [(s.host_path, s.tag, not s.writable) for s in boot.shares]
    entry = _one(dom, "sysinfo/entry")
    assert _one(dom, "sysinfo").get("type") == "fwcfg"
    assert (entry.get("name"), entry.text) == (SHARE_TABLE_FWCFG, share_table(boot))
    channel = _one(dom, "devices/channel")
    assert channel.get("type") == "unix"
    assert (_one(channel, "source").get("mode"), _one(channel, "source").get("path")) == (
        "bind",
        boot.agent_socket,
    )
    assert _one(channel, "target").attrib == {"type": "virtio", "name": "org.qemu.guest_agent.0"}
    assert _one(dom, "devices/serial/source").get("path") == boot.serial_log
    assert _one(dom, "devices/console/target").get("type") == "serial"
    assert "qmp.sock" not in libvirt_xml(plans.numa(), boot)


def test_disks_and_seed() -> None:
    boot = BootSpec(disk_image="/img/guest.qcow2", seed_image="/img/seed.iso")
    dom = _dom(plans.hpc_kvm(), boot)
    disks = dom.findall("devices/disk")
    got = [
        (
            _one(d, "source").get("file"),
            _one(d, "driver").get("type"),
            _one(d, "driver").get("iothread"),
            _one(d, "target").get("dev"),
            d.find("readonly") is not None,
        )
        for d in disks
    ]
    assert got == [
        ("/img/guest.qcow2", "qcow2", "1", "vda", False),
        ("/img/seed.iso", "raw", "2", "vdb", True),
    ]
    assert _dom(plans.naive()).find("devices/disk") is None
    assert _dom(plans.naive()).find("os/kernel") is None


def test_inconsistent_plan_is_refused() -> None:
    plan = plans.numa().model_copy(update={"guest_distances": ((10, 20),)})
    with pytest.raises(UsageError, match="matrix"):
        libvirt_xml(plan)


def test_the_completion_port_is_a_second_channel() -> None:
    boot = BootSpec(agent_socket="/run/x/qga.sock", done_socket="/run/x/done.sock")
    channels = _dom(plans.numa(), boot).findall("devices/channel")
    assert [(_one(c, "source").get("path"), _one(c, "target").get("name")) for c in channels] == [
        ("/run/x/qga.sock", "org.qemu.guest_agent.0"),
        ("/run/x/done.sock", "org.hpcvm.done.0"),
    ]
