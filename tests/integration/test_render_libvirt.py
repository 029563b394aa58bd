"""Rendered domains against the real libvirt: each validates with ``virt-xml-validate``
and is accepted by ``virsh define`` on the system libvirtd, and what libvirt stored
(``virsh dumpxml``) still holds the plan's pins, cells, distances, binding and pages.
Every domain gets a unique name and is undefined again, also when a check fails."""

from __future__ import annotations

import subprocess
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpcvm.bootspec import Share
from hpcvm.plan.model import VMPlan
from hpcvm.render import BootSpec, libvirt_xml
from hpcvm.units import parse_cpu_list
from tests import render_plans as plans
from tests.conftest import Snapshot
from tests.render_checks import check_libvirt_domain

if TYPE_CHECKING:
    from tests.integration.conftest import HugePages

pytestmark = pytest.mark.integration

#: When /dev/kvm is root-only, libvirtd re-probes QEMU's capabilities on nearly every
#: call (it sees KVM the probe, run as libvirt-qemu, cannot use): one define took 7 to
#: 220 s here. scripts/setup.sh now makes /dev/kvm root:kvm 0660; the timeout stays
#: generous for a machine where that is not so.
VIRSH_TIMEOUT = 600


def virsh(uri: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["virsh", "-c", uri, *args],
        capture_output=True,
        text=True,
        timeout=VIRSH_TIMEOUT,
        check=False,
    )
    if check:
        assert proc.returncode == 0, f"virsh {' '.join(args)}: {proc.stderr.strip()}"
    return proc


def validate(xml_file: Path) -> None:
    proc = subprocess.run(
        ["virt-xml-validate", str(xml_file), "domain"],
        capture_output=True,
        text=True,
        timeout=VIRSH_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, f"{xml_file}: {proc.stdout}{proc.stderr}"


def boot_for(tmp: Path, *, disk: bool = False) -> BootSpec:
    if disk:
        return BootSpec(disk_image=str(tmp / "guest.qcow2"), seed_image=str(tmp / "seed.img"))
    return BootSpec(
        kernel=str(tmp / "vmlinuz"),
        initrd=str(tmp / "initrd.img"),
        cmdline="console=ttyS0 quiet",
        shares=(
            Share(host_path="/usr", guest_path="/usr", tag="hpcvm0"),
            Share(host_path=str(tmp), guest_path="/data", tag="hpcvm1", writable=True),
        ),
        share_table=True,
        agent_socket=str(tmp / "qga.sock"),
        serial_log=str(tmp / "console.log"),
    )


class Defined:
    """Domains defined by one test; undefined at teardown whatever happened."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.names: list[str] = []

    def define(self, xml_file: Path, name: str) -> ET.Element:
        self.names.append(name)
        virsh(self.uri, "define", str(xml_file))
        return ET.fromstring(virsh(self.uri, "dumpxml", "--inactive", name).stdout)

    def cleanup(self) -> None:
        for name in self.names:
            virsh(self.uri, "undefine", name, check=False)
        listed = virsh(self.uri, "list", "--all", "--name").stdout.split()
        leftover = sorted(set(self.names) & set(listed))
        assert not leftover, f"domains left defined: {leftover}"


@pytest.fixture
def defined(libvirtd: str) -> Iterator[Defined]:
    d = Defined(libvirtd)
    try:
        yield d
    finally:
        d.cleanup()


def unique(plan: VMPlan) -> VMPlan:
    name = f"hpcvm-test-{plan.name}-{uuid.uuid4().hex[:8]}"
    return plan.model_copy(update={"name": name})


def check_stored(plan: VMPlan, dom: ET.Element) -> None:
    """libvirt kept what the plan says (it silently drops nothing we rely on)."""
    assert dom.findtext("name") == plan.name
    assert dom.get("type") == ("kvm" if plan.accel == "kvm" else "qemu")
    assert int(dom.findtext("vcpu") or 0) == plan.vcpus
    pins = {int(p.get("vcpu") or -1): p.get("cpuset") for p in dom.findall("cputune/vcpupin")}
    assert pins == {p.vcpu: str(p.host_pu) for p in plan.placements if p.host_pu is not None}
    emulator = dom.find("cputune/emulatorpin")
    assert (
        sorted(parse_cpu_list(emulator.get("cpuset") or "")) if emulator is not None else []
    ) == sorted(plan.emulator_pus)
    topo = dom.find("cpu/topology")
    assert topo is not None
    t = plan.topology
    assert [int(topo.get(k) or 0) for k in ("sockets", "dies", "cores", "threads")] == [
        t.sockets,
        t.dies,
        t.cores,
        t.threads,
    ]
    cells = dom.findall("cpu/numa/cell")
    assert [parse_cpu_list(c.get("cpus") or "") for c in cells] == [
        list(n.vcpus) for n in plan.guest_nodes
    ]
    assert [int(c.get("memory") or 0) * 1024 for c in cells] == [
        n.memory_bytes for n in plan.guest_nodes
    ]
    distances = tuple(
        tuple(int(s.get("value") or 0) for s in c.findall("distances/sibling")) for c in cells
    )
    assert distances == plan.guest_distances
    memnodes = {
        int(m.get("cellid") or -1): parse_cpu_list(m.get("nodeset") or "")
        for m in dom.findall("numatune/memnode")
    }
    assert memnodes == {
        r.guest_node: list(r.host_nodes)
        for r in plan.memory
        if r.guest_node is not None and r.policy == "bind" and r.host_nodes
    }
    pages = {int(p.get("size") or 0) * 1024 for p in dom.findall("memoryBacking/hugepages/page")}
    assert pages == {r.page_size_bytes for r in plan.memory if r.backend == "file"}


def render_validate_define(plan: VMPlan, boot: BootSpec, tmp: Path, defined: Defined) -> None:
    """The whole check for one plan: validate, define, compare what libvirt stored."""
    plan = unique(plan)
    xml_file = tmp / f"{plan.name}.xml"
    xml_file.write_text(libvirt_xml(plan, boot))
    validate(xml_file)
    check_stored(plan, defined.define(xml_file, plan.name))


@pytest.mark.parametrize("name", sorted(plans.all_plans()))
def test_domain_validates_and_defines(name: str, tmp_path: Path, defined: Defined) -> None:
    """Every hand-built plan, booted like the built-in guest (kernel, 9p root, agent)."""
    render_validate_define(plans.all_plans()[name], boot_for(tmp_path), tmp_path, defined)


def test_disk_boot_domain_defines(tmp_path: Path, defined: Defined) -> None:
    """A disk image and NoCloud seed on the hpc plan's I/O thread."""
    boot = boot_for(tmp_path, disk=True)
    render_validate_define(plans.hpc_tcg(), boot, tmp_path, defined)


@pytest.mark.parametrize("shape", sorted(plans.LIVE_SHAPES))
def test_planner_domain_for_this_host_defines(
    shape: str, tmp_path: Path, defined: Defined, hugepages: HugePages
) -> None:
    """The planner's plan for this machine, as the libvirt backend would define it."""
    hugepages.ensure_free(plans.PAGE_2M, plans.LIVE_MEMORY // plans.PAGE_2M)
    plan = plans.live_plan(shape, f"render-live-{shape}")
    check_libvirt_domain(plan, libvirt_xml(plan))
    render_validate_define(plan, boot_for(tmp_path), tmp_path, defined)


def test_snapshot_domains_validate(all_snapshots: list[Snapshot], tmp_path: Path) -> None:
    """Plans for machines that are not this one: schema-valid, and equal to their plan.
    (Not defined: libvirt checks page sizes and host nodes against this host.)"""
    count = 0
    for snap in all_snapshots:
        host = plans.snapshot_host(snap)
        for plan in plans.plans_for(host, snap.name) + plans.plans_for(
            plans.with_free_hugepages(host), snap.name
        ):
            text = libvirt_xml(plan, boot_for(tmp_path))
            check_libvirt_domain(plan, text)
            xml_file = tmp_path / f"{count}.xml"
            xml_file.write_text(text)
            validate(xml_file)
            count += 1
    assert count > 100


def test_validation_can_fail(tmp_path: Path) -> None:
    """virt-xml-validate rejects a domain we broke by hand, so a pass above means
    something: a cell without its required memory attribute."""
    text = libvirt_xml(plans.numa()).replace('memory="262144" unit="KiB"', "", 1)
    broken = tmp_path / "broken.xml"
    broken.write_text(text)
    proc = subprocess.run(
        ["virt-xml-validate", str(broken), "domain"], capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0


def test_define_can_fail(tmp_path: Path, defined: Defined) -> None:
    """libvirt refuses NUMA cells holding more CPUs than the domain has (a schema-valid
    domain, so this is libvirt's own check); nothing stays defined."""
    plan = unique(plans.numa())
    text = libvirt_xml(plan).replace('<vcpu placement="static">2</vcpu>', "<vcpu>1</vcpu>")
    assert text != libvirt_xml(plan)
    bad = tmp_path / "bad.xml"
    bad.write_text(text)
    defined.names.append(plan.name)
    proc = virsh(defined.uri, "define", str(bad), check=False)
    assert proc.returncode != 0
    assert "exceeds the <vcpu> count" in proc.stderr
    assert plan.name not in virsh(defined.uri, "list", "--all", "--name").stdout.split()
