"""What the libvirt backend changes in the rendered domain, checked on the XML itself
and against libvirt's schema (virt-xml-validate, no daemon needed).

Plans are real: the planner's output for this machine's numa profile is stored in
tests/unit/data/verify (captured from a VM that ran), so the domain is the one the
backend really defines.
"""

from __future__ import annotations

import pwd
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpcvm.bootspec import BootSpec, Share
from hpcvm.errors import UsageError
from hpcvm.plan.model import VMPlan
from hpcvm.runtime.backends import libvirt_backend as lb
from hpcvm.runtime.machine.model import Machine

DATA = Path(__file__).parent / "data" / "verify"


def _machine(plan_file: Path, run_dir: str = "/run/hpcvm/job1") -> Machine:
    plan = VMPlan.model_validate_json(plan_file.read_text())
    boot = BootSpec(
        kernel="/var/cache/hpcvm/guest/vmlinuz",
        initrd="/var/cache/hpcvm/guest/initrd.img",
        cmdline="console=ttyS0 quiet panic=-1 hpcvm.shares=opt/org.hpcvm/shares",
        shares=(Share(host_path="/usr", guest_path="/usr", tag="hpcvm0"),),
        share_table=True,
        agent_socket=f"{run_dir}/agent.sock",
        serial_log=f"{run_dir}/console.log",
    )
    return Machine(
        name="job1",
        backend="libvirt",
        run_dir=run_dir,
        pid=None,
        started_at=time.time(),
        plan=plan,
        boot=boot,
        image="builtin:test",
    )


NUMA = DATA / "libvirt-numa2" / "plan.json"  # 2M huge pages, 2 guest nodes
FLAT = DATA / "guest" / "flat-2vcpu-512M.plan.json"  # anonymous memory


def test_domain_is_named_and_marked_as_this_vms() -> None:
    xml = lb.domain_xml(_machine(NUMA))
    root = ET.fromstring(xml)
    assert root.findtext("name") == "hpcvm-job1"
    assert lb.owner_run_dir(xml) == "/run/hpcvm/job1"
    assert lb.owner_run_dir("<domain><name>x</name></domain>") is None
    assert lb.owner_run_dir("not xml") is None


def test_libvirt_keeps_its_own_dac_label() -> None:
    """No seclabel: libvirt's DAC driver runs QEMU as qemu.conf's user (never root,
    see dac_user) and owns the kernel, initrd and its own files for the guest."""
    root = ET.fromstring(lb.domain_xml(_machine(NUMA)))
    assert root.findall("seclabel") == []


CAPS = """<capabilities><host>
  <secmodel><model>none</model><doi>0</doi></secmodel>
  <secmodel><model>dac</model><doi>0</doi>
    <baselabel type='kvm'>{label}</baselabel>
    <baselabel type='qemu'>{label}</baselabel>
  </secmodel>
</host></capabilities>"""


def test_dac_user_is_read_from_the_capabilities() -> None:
    me = pwd.getpwnam("nobody")  # any user but root
    user = lb.dac_user(CAPS.format(label=f"+{me.pw_uid}:+{me.pw_gid}"))
    assert (user.name, user.uid, user.gid, user.switch) == (me.pw_name, me.pw_uid, me.pw_gid, True)
    assert me.pw_gid in user.groups


@pytest.mark.parametrize(
    "caps",
    [CAPS.format(label="+0:+0"), "<capabilities><host/></capabilities>"],
    ids=["root", "no-dac"],
)
def test_libvirt_running_qemu_as_root_is_refused(caps: str) -> None:
    with pytest.raises(UsageError, match=r"qemu\.conf") as info:
        lb.dac_user(caps)
    assert "\n" not in info.value.message


def test_huge_pages_come_from_memfd_and_anonymous_memory_is_untouched() -> None:
    backing = ET.fromstring(lb.domain_xml(_machine(NUMA))).find("memoryBacking")
    assert backing is not None and backing.find("hugepages") is not None
    source = backing.find("source")
    assert source is not None and source.get("type") == "memfd"
    tags = [child.tag for child in backing]
    assert tags.index("hugepages") < tags.index("source")
    if "allocation" in tags:
        assert tags.index("source") < tags.index("allocation")  # libvirt's schema order
    flat = ET.fromstring(lb.domain_xml(_machine(FLAT)))
    assert flat.find("memoryBacking/source") is None


def test_builtin_guest_agent_moves_off_libvirts_agent_name() -> None:
    machine = lb.with_private_agent_port(_machine(NUMA))
    assert machine.boot.agent_port_name == lb.AGENT_PORT != "org.qemu.guest_agent.0"
    assert machine.boot.cmdline is not None
    assert machine.boot.cmdline.endswith(f" hpcvm.agent={lb.AGENT_PORT}")
    assert lb.with_private_agent_port(machine) == machine  # idempotent
    channel = ET.fromstring(lb.domain_xml(machine)).find("devices/channel/target")
    assert channel is not None and channel.get("name") == lb.AGENT_PORT


def test_disk_image_keeps_the_standard_agent_name_and_is_refused() -> None:
    machine = _machine(FLAT)
    image = machine.model_copy(
        update={"boot": BootSpec(disk_image="/images/x.qcow2", agent_socket="/run/a.sock")}
    )
    assert lb.with_private_agent_port(image) == image
    # Refused before any libvirt call: the backend's URI points nowhere.
    backend = lb.LibvirtBackend("qemu:///system?socket=/nonexistent/libvirt-sock")
    with pytest.raises(UsageError, match="--image with --backend libvirt"):
        backend.start(image)


@pytest.mark.parametrize("plan_file", [NUMA, FLAT], ids=["numa", "flat"])
def test_adapted_domain_is_valid_for_libvirt(plan_file: Path, tmp_path: Path) -> None:
    tool = shutil.which("virt-xml-validate")
    if tool is None:
        pytest.fail("virt-xml-validate not found: run scripts/setup.sh (libvirt-clients)")
    path = tmp_path / "domain.xml"
    path.write_text(lb.domain_xml(lb.with_private_agent_port(_machine(plan_file))))
    done = subprocess.run([tool, str(path), "domain"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout


def test_one_line_joins_libvirts_multiline_errors() -> None:
    text = "internal error: qemu unexpectedly closed the monitor:\n  warning: x\n\nqemu: bad\n"
    assert (
        lb.one_line(text)
        == "internal error: qemu unexpectedly closed the monitor: | warning: x | qemu: bad"
    )


def test_a_dead_virtlogd_gets_its_fix_in_the_error() -> None:
    """libvirtd answers but cannot start a domain when its log daemon is gone (the
    error text is libvirt's own, as a libvirtd without virtlogd printed it in CI)."""
    libvirt = pytest.importorskip("libvirt")
    text = "Failed to connect socket to '/run/libvirt/virtlogd-sock': Connection refused"
    message = lb._error_text(libvirt.libvirtError(text))
    assert message.startswith(text) and "start virtlogd" in message
    assert "\n" not in message
    assert lb._error_text(libvirt.libvirtError("domain is not running")) == (
        "domain is not running"
    )
