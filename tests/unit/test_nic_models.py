"""The NIC model table (nic_models.py): every part of hpcvm reads a model from its one
row, so a model registered from outside (as a plugin does: tests/data/plugins/
hpcvm_demo_nic.py, run end to end by tests/integration/test_cluster_plugins.py) is
parsed, rendered for QEMU and libvirt, named in bench variants and checked in the guest
like hpcvm's own. Oracles: QEMU's own device list and properties, libvirt's schema
(virt-xml-validate)."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from hpcvm.bench.envs.kinds import parse_env
from hpcvm.bench.envs.variants import VmVariant
from hpcvm.bootspec import BootSpec, Nic
from hpcvm.errors import UsageError
from hpcvm.guest.modules import GUEST_MODULES
from hpcvm.nic_models import NIC_MODELS, NicModelSpec, nic_model, register_nic_model
from hpcvm.render import libvirt_xml
from hpcvm.render.qemu import qemu_argv
from hpcvm.runtime.net import bridge as net_bridge
from hpcvm.runtime.net.base import ifname_for, mac_for
from hpcvm.runtime.net.network import parse_network
from hpcvm.runtime.verify.variant import VariantSeen, check_nic_drivers
from tests import render_plans as plans

# What a plugin would add: QEMU's RTL8139 (a real QEMU device and a real guest driver),
# not one of hpcvm's own models.
RTL = NicModelSpec(
    name="rtl8139",
    qemu_device="rtl8139",
    libvirt_model="rtl8139",
    guest_driver="8139cp",
    guest_modules=("8139cp",),
)


@pytest.fixture
def rtl(monkeypatch: pytest.MonkeyPatch) -> Iterator[NicModelSpec]:
    """RTL registered for one test, as a plugin registers a model, then gone again."""
    monkeypatch.setattr(NIC_MODELS, "_items", dict(NIC_MODELS._items))
    register_nic_model(RTL)
    yield RTL


def _nic(model: str) -> Nic:
    nic = Nic(
        kind="bridge", source="br0", model=model, mac=mac_for("job1"),
        ifname=ifname_for("job1"), address="10.77.0.101/24", mtu=1500,
    )  # fmt: skip
    return nic.model_copy(update={"wiring": net_bridge.BridgeKind().wiring(nic)})


def _qemu() -> str:
    qemu = shutil.which("qemu-system-x86_64")
    assert qemu is not None, "qemu-system-x86_64 not found: run scripts/setup.sh"
    return qemu


def test_hpcvm_models_are_devices_qemu_has_and_drivers_the_guest_loads() -> None:
    listed = subprocess.run(
        [_qemu(), "-device", "help"], capture_output=True, text=True, check=True
    ).stdout
    assert list(NIC_MODELS) == ["virtio", "e1000"]  # the order GUEST_MODULES keeps
    for spec in NIC_MODELS.values():
        assert f'name "{spec.qemu_device}"' in listed, spec.qemu_device
        assert set(spec.guest_modules) <= set(GUEST_MODULES)
        props = subprocess.run(
            [_qemu(), "-device", f"{spec.qemu_device},help"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        # the paravirtual model tells the guest the MTU: QEMU must have the property
        assert ("host_mtu=" in props) == spec.paravirtual, spec.name


def test_a_registered_model_is_parsed_rendered_varied_and_checked(
    rtl: NicModelSpec, tmp_path: Path
) -> None:
    assert parse_network("bridge=br0,model=rtl8139").model == "rtl8139"
    argv = qemu_argv(plans.naive(), BootSpec(nics=(_nic("rtl8139"),)))
    (device,) = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-device" and
                 "netdev=net0" in argv[i + 1]]  # fmt: skip
    assert device.startswith("rtl8139,") and "host_mtu" not in device
    props = subprocess.run(
        [_qemu(), "-device", "rtl8139,help"], capture_output=True, text=True, check=True
    ).stdout
    assert "mac=" in props and "netdev=" in props  # what the line sets, QEMU has
    text = libvirt_xml(plans.numa(), BootSpec(nics=(_nic("rtl8139"),)))
    (iface,) = ET.fromstring(text).findall("devices/interface")
    assert iface.find("model").get("type") == "rtl8139"  # type: ignore[union-attr]
    assert iface.find("driver") is None  # vhost is virtio's alone
    tool = shutil.which("virt-xml-validate")
    assert tool is not None, "virt-xml-validate not found: run scripts/setup.sh"
    (tmp_path / "domain.xml").write_text(text)
    done = subprocess.run([tool, str(tmp_path / "domain.xml"), "domain"], capture_output=True)
    assert done.returncode == 0, done.stderr
    assert parse_env("vm:hpc+rtl8139").variant == VmVariant(nic="rtl8139")
    seen = VariantSeen(guest_thp=None, nic_drivers={mac_for("job1").lower(): "8139cp"})
    (check,) = check_nic_drivers([_nic("rtl8139")], seen)
    assert check.ok and "8139cp" in check.expected


def test_an_unknown_model_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"unknown model 'rtl8139': use virtio or e1000$"):
        parse_network("bridge=br0,model=rtl8139")
    with pytest.raises(UsageError, match=r"unknown NIC model 'rtl8139': use one of virtio, e1000"):
        nic_model("rtl8139")  # a record of a plugin's model, read without the plugin
    with pytest.raises(UsageError, match="rtl8139"):
        parse_env("vm:hpc+rtl8139")


def test_a_model_registered_twice_or_as_vfio_is_refused(rtl: NicModelSpec) -> None:
    with pytest.raises(UsageError, match="NIC model 'rtl8139' is registered twice"):
        register_nic_model(rtl)
    with pytest.raises(UsageError, match="'vfio' is the passed-through VF's"):
        register_nic_model(replace(rtl, name="vfio"))


def test_a_record_naming_an_unknown_model_is_refused_where_it_is_read() -> None:
    """A damaged or foreign record (a plugin's model, read without the plugin) fails
    pydantic's validation, as any other wrong field does, not later in a renderer."""
    nic = _nic("e1000").model_dump()
    assert Nic.model_validate(nic).model == "e1000"
    assert Nic.model_validate({**nic, "model": "vfio"}).model == "vfio"
    with pytest.raises(ValidationError, match="unknown NIC model 'rtl8139'"):
        Nic.model_validate({**nic, "model": "rtl8139"})
