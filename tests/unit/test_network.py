"""runtime/net/network.py without a host network: parsing, refusals, deterministic names,
and how a NIC is rendered (QEMU argv; libvirt XML checked by virt-xml-validate) and
verified (the guest's ``ip -j addr``, captured from a real guest)."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpcvm.bootspec import BootSpec, Nic, nic_kernel_arg
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.render import libvirt_xml
from hpcvm.render.qemu import qemu_argv
from hpcvm.runtime.net import base as netlink
from hpcvm.runtime.net import bridge as net_bridge
from hpcvm.runtime.net import macvtap as net_macvtap
from hpcvm.runtime.net import network
from hpcvm.runtime.net import vf as net_vf
from hpcvm.runtime.net.base import check_address, ifname_for, mac_for, parse_address, tap_mac
from hpcvm.runtime.net.network import NETWORK_KINDS, parse_network
from hpcvm.runtime.verify.nics import nic_checks
from tests import render_plans as plans

IFNAMSIZ = 16  # the kernel's limit, with the terminating NUL


def _nic(model: str = "virtio", vhost: bool = False, mtu: int = 1500) -> Nic:
    """A bridge NIC as the bridge kind resolves one, wiring included."""
    nic = Nic(
        kind="bridge",
        source="br0",
        model=model,  # type: ignore[arg-type]
        mac=mac_for("job1"),
        ifname=ifname_for("job1"),
        address="10.77.0.101/24",
        mtu=mtu,
        vhost=vhost,
    )
    return nic.model_copy(update={"wiring": net_bridge.BridgeKind().wiring(nic)})


# -- parsing ----------------------------------------------------------------------------


def test_bridge_with_options() -> None:
    req = parse_network("bridge=brX,model=e1000,mtu=9000")
    assert (req.kind, req.source, req.model, req.mtu) == ("bridge", "brX", "e1000", 9000)


def test_defaults_model_alone_means_a_tap_in_br0() -> None:
    assert parse_network("bridge=br1") == network.NetworkRequest("bridge", "br1", "virtio", None)
    assert parse_network("model=e1000") == network.NetworkRequest("bridge", "br0", "e1000", None)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("bridge", "not KEY=VALUE"),
        ("bridge=", "not KEY=VALUE"),
        ("bridge=br0,bridge=br1", "given twice"),
        ("bridge=br0,model=rtl8139", "unknown model 'rtl8139'"),
        ("bridge=br0,mtu=big", "not a number"),
        ("bridge=br0,mtu=40", "below the IPv4 minimum"),
    ],
)
def test_malformed_network_is_refused(text: str, match: str) -> None:
    with pytest.raises(UsageError, match=match) as info:
        parse_network(text)
    assert "\n" not in info.value.message


def test_unknown_key_names_every_registered_kind() -> None:
    with pytest.raises(UsageError) as info:
        parse_network("tap=tap0")
    message = info.value.message
    assert "unknown key 'tap'" in message
    for kind in NETWORK_KINDS:  # the registry is the oracle, not a list in the test
        assert kind in message


def test_macvtap_parses_with_its_options() -> None:
    assert parse_network("macvtap=eth0,model=e1000,mtu=1400") == network.NetworkRequest(
        kind="macvtap", source="eth0", model="e1000", mtu=1400
    )


@pytest.mark.parametrize(
    ("parent", "match"),
    [
        ("nosuchnic0", "no interface 'nosuchnic0' in this network namespace"),
        ("lo", "lo is not an Ethernet device"),  # the kernel refuses a macvtap on it
    ],
)
def test_macvtap_needs_an_ethernet_parent(parent: str, match: str) -> None:
    kind = NETWORK_KINDS["macvtap"]
    with pytest.raises(UsageError, match=match):
        kind.resolve(parse_network(f"macvtap={parent}"), vm="x", index=0, address=None, warn=print)


def test_address_parsing() -> None:
    assert parse_address("10.77.0.101/24") == ipaddress.IPv4Interface("10.77.0.101/24")
    for bad, match in [
        ("10.77.0.101", "no prefix length"),
        ("10.77.0.0/24", "network's or broadcast"),
        ("10.77.0.255/24", "network's or broadcast"),
        ("10.77.0.300/24", "not an IPv4"),
        ("fe80::1/64", "not an IPv4"),
    ]:
        with pytest.raises(UsageError, match=match):
            parse_address(bad)


def test_address_against_the_bridge_subnet() -> None:
    on_bridge = [ipaddress.IPv4Interface("10.77.0.1/24")]
    assert check_address(ipaddress.IPv4Interface("10.77.0.9/24"), "br0", on_bridge) is None
    outside = check_address(ipaddress.IPv4Interface("10.78.0.9/24"), "br0", on_bridge)
    assert outside is not None and "outside br0's subnet 10.77.0.0/24" in outside
    own = check_address(ipaddress.IPv4Interface("10.77.0.1/24"), "br0", on_bridge)
    assert own is not None and "own address" in own
    assert check_address(ipaddress.IPv4Interface("10.78.0.9/24"), "br0", []) is None


def test_address_without_network_and_unprivileged_are_refused() -> None:
    with pytest.raises(UsageError, match="--address needs --network"):
        network.resolve_nics(None, "10.0.0.2/24", vm="x", privileged=True)
    # a macvtap has no way for a user (a bridge has: QEMU's bridge helper, test_bridge_helper)
    with pytest.raises(UsageError, match="needs root"):
        network.resolve_nics("macvtap=eth0", None, vm="x", privileged=False)
    assert network.resolve_nics(None, None, vm="x", privileged=False) == ()


# -- deterministic names ------------------------------------------------------------------


def test_mac_is_deterministic_locally_administered_unicast() -> None:
    macs = {mac_for(f"vm{i}") for i in range(200)} | {mac_for("vm0", 1)}
    # a job's VMs may share a name (one per node): their addresses tell them apart
    macs |= {mac_for("job", 0, f"10.77.0.{100 + k}/24") for k in range(1, 9)}
    assert len(macs) == 209  # distinct per name, per index and per address
    assert mac_for("vm0") == mac_for("vm0")
    for mac in macs:
        octets = [int(o, 16) for o in mac.split(":")]
        assert len(octets) == 6
        assert octets[0] & 0x02, "locally administered bit"
        assert not octets[0] & 0x01, "unicast"
    tap = [int(o, 16) for o in tap_mac(mac_for("vm0")).split(":")]
    assert tap[0] == 0xFE and tap[0] & 0x02 and not tap[0] & 0x01
    assert tap[1:] == [int(o, 16) for o in mac_for("vm0").split(":")][1:]


def test_ifname_fits_the_kernel_and_avoids_vir() -> None:
    names = {ifname_for(f"vm{i}") for i in range(200)}
    assert len(names) == 200
    assert ifname_for("vm0") == ifname_for("vm0")
    for name in names:
        assert len(name) < IFNAMSIZ
        assert not name.startswith("vir")
        assert name.isascii() and name.isalnum()


def test_kernel_arg() -> None:
    nic = _nic(mtu=1400)
    assert nic_kernel_arg(nic) == f"hpcvm.net={nic.mac},10.77.0.101/24,1400"
    bare = nic.model_copy(update={"address": None})
    assert nic_kernel_arg(bare) == f"hpcvm.net={nic.mac},,1400"


# -- rendering ------------------------------------------------------------------------


def _pairs(argv: list[str], flag: str) -> list[dict[str, str]]:
    out = []
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            head, *rest = argv[i + 1].split(",")
            out.append({"_": head, **dict(r.split("=", 1) for r in rest)})
    return out


def test_qemu_argv_has_tap_and_device() -> None:
    plan = plans.naive()
    without = qemu_argv(plan, BootSpec())
    assert "-netdev" not in without
    argv = qemu_argv(plan, BootSpec(nics=(_nic(vhost=True),)))
    (netdev,) = _pairs(argv, "-netdev")
    assert netdev == {
        "_": "tap",
        "id": "net0",
        "ifname": ifname_for("job1"),
        "script": "no",
        "downscript": "no",
        "vhost": "on",
    }
    devices = [d for d in _pairs(argv, "-device") if d.get("netdev") == "net0"]
    assert devices == [
        {"_": "virtio-net-pci", "netdev": "net0", "id": "nic0", "mac": mac_for("job1"),
         "host_mtu": "1500"}
    ]  # fmt: skip
    e1000 = qemu_argv(plan, BootSpec(nics=(_nic("e1000"),)))
    (netdev,) = _pairs(e1000, "-netdev")
    assert "vhost" not in netdev
    (device,) = [d for d in _pairs(e1000, "-device") if d.get("netdev") == "net0"]
    assert device["_"] == "e1000" and "host_mtu" not in device
    # a NIC adds its two options and changes nothing else on the line
    with_nic = qemu_argv(plan, BootSpec(nics=(_nic(),)))
    at = with_nic.index("-netdev")
    assert with_nic[at + 2] == "-device" and "netdev=net0" in with_nic[at + 3]
    assert with_nic[:at] + with_nic[at + 4 :] == without


def test_qemu_knows_the_device_properties_we_use() -> None:
    """QEMU itself is the oracle for the property names on the virtio-net line."""
    qemu = shutil.which("qemu-system-x86_64")
    assert qemu is not None, "qemu-system-x86_64 not found: run scripts/setup.sh"
    for device, props in (("virtio-net-pci", ("host_mtu", "mac", "netdev")), ("e1000", ("mac",))):
        out = subprocess.run(
            [qemu, "-device", f"{device},help"], capture_output=True, text=True, check=True
        ).stdout
        for prop in props:
            assert f"{prop}=" in out, f"{device} has no property {prop}"


def test_libvirt_macvtap_is_a_direct_interface_that_validates(tmp_path: Path) -> None:
    tool = shutil.which("virt-xml-validate")
    if tool is None:
        pytest.fail("virt-xml-validate not found: run scripts/setup.sh (libvirt-clients)")
    nic = _nic(vhost=True).model_copy(update={"kind": "macvtap", "source": "eth0"})
    nic = nic.model_copy(update={"wiring": net_macvtap.MacvtapKind().wiring(nic)})
    text = libvirt_xml(plans.numa(), BootSpec(nics=(nic,)))
    (iface,) = ET.fromstring(text).findall("devices/interface")
    assert iface.get("type") == "direct"
    source = iface.find("source")
    assert source is not None and source.attrib == {"dev": "eth0", "mode": "bridge"}
    assert iface.find("mac").get("address") == nic.mac  # type: ignore[union-attr]
    path = tmp_path / "domain.xml"
    path.write_text(text)
    done = subprocess.run([tool, str(path), "domain"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.parametrize(
    ("model", "vhost"), [("virtio", True), ("virtio", False), ("e1000", False)]
)
def test_libvirt_interface_validates(model: str, vhost: bool, tmp_path: Path) -> None:
    tool = shutil.which("virt-xml-validate")
    if tool is None:
        pytest.fail("virt-xml-validate not found: run scripts/setup.sh (libvirt-clients)")
    nic = _nic(model, vhost, mtu=9000)
    text = libvirt_xml(plans.numa(), BootSpec(nics=(nic,)))
    (iface,) = ET.fromstring(text).findall("devices/interface")
    assert iface.get("type") == "bridge"
    assert iface.find("mac").get("address") == nic.mac  # type: ignore[union-attr]
    assert iface.find("source").get("bridge") == "br0"  # type: ignore[union-attr]
    assert iface.find("target").get("dev") == nic.ifname  # type: ignore[union-attr]
    assert iface.find("model").get("type") == model  # type: ignore[union-attr]
    assert iface.find("mtu").get("size") == "9000"  # type: ignore[union-attr]
    driver = iface.find("driver")
    if model == "virtio":
        assert driver is not None and driver.get("name") == ("vhost" if vhost else "qemu")
    path = tmp_path / "domain.xml"
    path.write_text(text)
    done = subprocess.run([tool, str(path), "domain"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "<interface" not in libvirt_xml(plans.numa(), BootSpec())


# -- verify -----------------------------------------------------------------------------

# ``ip -j addr show`` in a built-in guest booted with --network bridge=brt
# --address 10.99.0.2/24 (VM "nettry"), trimmed to the fields iproute2 always prints.
GUEST_IP = [
    {"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536,
     "address": "00:00:00:00:00:00",
     "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifindex": 2, "ifname": "eth0", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
     "mtu": 1500, "address": "0a:f9:bf:6c:99:18",
     "addr_info": [{"family": "inet", "local": "10.99.0.2", "prefixlen": 24},
                   {"family": "inet6", "local": "fe80::8f9:bfff:fe6c:9918", "prefixlen": 64}]},
]  # fmt: skip


def _guest_nic(**update: object) -> Nic:
    nic = Nic(
        kind="bridge",
        source="brt",
        mac=GUEST_IP[1]["address"],
        ifname=ifname_for("nettry"),
        address="10.99.0.2/24",
        mtu=1500,
    )
    return nic.model_copy(update=update)


def test_verify_nic_matches_the_guest() -> None:
    checks = nic_checks([_guest_nic()], json.dumps(GUEST_IP))
    assert [c.name for c in checks] == [
        "NIC 0a:f9:bf:6c:99:18 MTU",
        "NIC 0a:f9:bf:6c:99:18 up",
        "NIC 0a:f9:bf:6c:99:18 address",
    ]
    assert all(c.ok for c in checks), checks


@pytest.mark.parametrize(
    ("update", "failing"),
    [
        ({"mtu": 9000}, "MTU"),
        ({"address": "10.99.0.3/24"}, "address"),
        ({"address": "10.99.0.2/16"}, "address"),
        ({"mac": "0a:00:00:00:00:01"}, "0a:00:00:00:00:01"),
    ],
)
def test_verify_nic_mismatch_fails(update: dict[str, object], failing: str) -> None:
    checks = nic_checks([_guest_nic(**update)], json.dumps(GUEST_IP))
    bad = [c for c in checks if not c.ok]
    assert len(bad) == 1 and bad[0].name.endswith(failing), checks


def test_verify_down_link_and_garbage() -> None:
    down = json.loads(json.dumps(GUEST_IP))
    down[1]["flags"] = ["BROADCAST", "MULTICAST"]
    (bad,) = [c for c in nic_checks([_guest_nic()], json.dumps(down)) if not c.ok]
    assert bad.name.endswith(" up")
    (broken,) = nic_checks([_guest_nic()], "not json")
    assert not broken.ok


# -- vf (a fake sysfs: no SR-IOV NIC exists on the machines hpcvm is tested on) --------


def _fake_sysfs(root: Path, pf_netdev: str = "lo") -> Path:
    """bus/pci/devices as the kernel lays it out for a PF 0000:01:00.0 with two VFs
    (01:00.2 bound to vfio-pci, 01:00.3 to iavf): relative links, as in /sys."""
    devices = root / "bus" / "pci" / "devices"
    drivers = root / "bus" / "pci" / "drivers"
    for driver in ("vfio-pci", "iavf", "ice"):
        (drivers / driver).mkdir(parents=True)
    pf = devices / "0000:01:00.0"
    (pf / "net" / pf_netdev).mkdir(parents=True)
    (pf / "driver").symlink_to("../../drivers/ice")
    for index, (fn, driver) in enumerate([("2", "vfio-pci"), ("3", "iavf")]):
        vf = devices / f"0000:01:00.{fn}"
        vf.mkdir()
        (vf / "physfn").symlink_to("../0000:01:00.0")
        (vf / "driver").symlink_to(f"../../drivers/{driver}")
        (pf / f"virtfn{index}").symlink_to(f"../0000:01:00.{fn}")
    return root


def test_vf_found_through_its_physical_function(tmp_path: Path) -> None:
    kind = net_vf.VfKind(_fake_sysfs(tmp_path))
    vf = kind.virtual_function("0000:01:00.3")
    assert (vf.pf_bdf, vf.index, vf.pf_netdev, vf.driver) == ("0000:01:00.0", 1, "lo", "iavf")
    with pytest.raises(UsageError, match="not an SR-IOV virtual function"):
        kind.virtual_function("0000:01:00.0")
    with pytest.raises(UsageError, match=r"no PCI device 0000:09:00\.0"):
        kind.virtual_function("0000:09:00.0")


def test_vf_auto_takes_a_free_vfio_bound_vf(tmp_path: Path) -> None:
    kind = net_vf.VfKind(_fake_sysfs(tmp_path))
    assert kind.free_vf([]) == "0000:01:00.2"  # 01:00.3 is bound to iavf, not vfio-pci
    with pytest.raises(UsageError, match="no free SR-IOV VF bound to vfio-pci"):
        kind.free_vf(["0000:01:00.2"])


def test_vf_nic_resolves_against_the_pf_interface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake PF's interface is "lo", which every network namespace has: its MTU and
    # address are read over netlink for real.
    monkeypatch.setenv("HPCVM_RUNTIME_DIR", str(tmp_path / "rt"))
    kind = net_vf.VfKind(_fake_sysfs(tmp_path / "sys"))
    req = parse_network("vf=01:00.2")
    nic = kind.resolve(req, vm="job1", index=0, address="127.0.0.5/8", warn=print)
    assert (nic.kind, nic.source, nic.model, nic.ifname) == ("vf", "0000:01:00.2", "vfio", "lo")
    assert nic.mac == mac_for("job1", 0, "127.0.0.5/8")
    assert nic.mtu == netlink.link("lo")["mtu"]  # type: ignore[index]
    auto = kind.resolve(parse_network("vf=auto"), vm="job1", index=0, address=None, warn=print)
    assert auto.source == "0000:01:00.2"
    with pytest.raises(UsageError, match="outside lo's subnet"):
        kind.resolve(req, vm="job1", index=0, address="10.0.0.5/8", warn=print)
    with pytest.raises(UsageError, match="no model="):
        kind.resolve(parse_network("vf=01:00.2,model=e1000"), vm="j", index=0, address=None,
                     warn=print)  # fmt: skip
    # a VF is rendered by the plan's passthrough, never as a tap
    assert "-netdev" not in qemu_argv(plans.naive(), BootSpec(nics=(nic,)))
    assert "<interface" not in libvirt_xml(plans.naive(), BootSpec(nics=(nic,)))


def test_vf_pf_outside_this_namespace_is_refused(tmp_path: Path) -> None:
    kind = net_vf.VfKind(_fake_sysfs(tmp_path, pf_netdev="hvnosuchpf0"))
    with pytest.raises(UsageError, match="hvnosuchpf0 is not in this network namespace"):
        kind.resolve(parse_network("vf=01:00.2"), vm="j", index=0, address=None, warn=print)


def test_vf_joins_the_plan_request_as_passthrough(tmp_path: Path) -> None:
    from hpcvm.plan.model import PlanRequest
    from hpcvm.runtime.net import vm_nics

    nic = Nic(kind="vf", source="0000:01:00.2", model="vfio", mac=mac_for("j"), ifname="lo",
              mtu=1500)  # fmt: skip
    request = PlanRequest(profile="hpc", vcpus=1, memory_bytes=256 << 20)
    assert vm_nics.with_vfs(request, (nic,)).passthrough == ("0000:01:00.2",)
    typed = request.model_copy(update={"passthrough": ("01:00.2",)})
    assert vm_nics.with_vfs(typed, (nic,)).passthrough == ("01:00.2",)  # not twice
    with pytest.raises(UsageError, match=r"does not pass through the VF 0000:01:00\.2"):
        vm_nics.plan_has_vfs(plans.naive(), (nic,))


def test_libvirt_attaches_bridge_taps_itself_not_vf_macs() -> None:
    nic = _nic()  # its tap does not exist: attaching it for real must fail
    network.attach_nics([nic], by_daemon=True)  # libvirt's job: nothing is run
    with pytest.raises(RuntimeFailure, match=f"ip link set dev {nic.ifname}"):
        network.attach_nics([nic])
    assert NETWORK_KINDS["bridge"].libvirt_attaches
    assert not NETWORK_KINDS["vf"].libvirt_attaches
