"""``--network bridge=...`` with real parts: a network namespace of the test's own with a
bridge holding 10.99.0.1/24, hpcvm run inside it (``nsenter --net``, as the test
cluster's nodes run), the built-in guest under TCG.

Oracles: the namespace's own links (``ip -j`` in it: the tap, its bridge, its MTU), QMP
(``qom-get`` of the NIC device's MAC), the guest's ``ip -j addr`` and pings
both ways; for hpcvm-netguard's anti-spoofing, the namespace's neighbour table (the
kernel's own view of who has an address) and nft's counters and chains. Nothing is
taken from hpcvm's own answers except the record's names, which the oracles then
confirm. One guest per model (virtio, e1000), two for anti-spoofing, 1 vCPU, 256 MiB.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hpcvm.runtime.channels import qmp
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from tests.runtime_support import (
    HPCVM,
    isolated_runtime,
    one_line_error,
)

pytestmark = pytest.mark.integration

BRIDGE = "brnt0"
HOST_ADDR = "10.99.0.1/24"
BRIDGE_MTU = 1400  # not the default 1500: the guest's MTU must come from the bridge
BUSYBOX_IN_GUEST = "/run/hpcvm/busybox"  # the built-in guest's busybox (guest/scripts.py)
VM = ("--profile", "naive", "--vcpus", "1", "--memory", "256M", "--accel", "tcg")


@dataclass(frozen=True)
class Netns:
    name: str

    @property
    def enter(self) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.name}"]

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.enter, *argv], capture_output=True, text=True, timeout=timeout, check=False
        )

    def hpcvm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run(HPCVM, *args, timeout=timeout)

    def links(self) -> list[dict[str, Any]]:
        out = self.run("ip", "-j", "-d", "link", "show").stdout
        return list(json.loads(out or "[]"))

    def link(self, name: str) -> dict[str, Any] | None:
        return next((ln for ln in self.links() if ln["ifname"] == name), None)


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def netns() -> Iterator[Netns]:
    """A namespace with one bridge (10.99.0.1/24, MTU 1400); deleted at the end."""
    ns = Netns(f"hpcvm-nettest-{os.getpid()}")
    _ip("netns", "add", ns.name)
    try:
        _ip("-n", ns.name, "link", "set", "lo", "up")
        _ip("-n", ns.name, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", ns.name, "link", "set", BRIDGE, "mtu", str(BRIDGE_MTU), "up")
        _ip("-n", ns.name, "addr", "add", HOST_ADDR, "dev", BRIDGE)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, check=False)


@pytest.fixture
def runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guest: None, netns: Netns
) -> Iterator[Path]:
    with isolated_runtime(
        tmp_path, monkeypatch, lambda: netns.hpcvm("down", "--all", "--timeout", "10")
    ) as root:
        yield root
    assert _taps(netns) == [], "a tap was left in the namespace"


def _taps(ns: Netns) -> list[str]:
    return [ln["ifname"] for ln in ns.links() if ln.get("linkinfo", {}).get("info_kind") == "tun"]


def _guest_links(ns: Netns, name: str) -> list[dict[str, Any]]:
    proc = ns.hpcvm("exec", name, "--", "ip", "-j", "addr", "show")
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


def _qemu_mac(machine: Machine) -> str:
    """The MAC of the NIC device (id nic0) as QEMU has it (QMP qom-get)."""
    assert machine.boot.qmp_socket is not None
    args = {"path": "/machine/peripheral/nic0", "property": "mac"}
    return str(qmp.execute(Path(machine.boot.qmp_socket), "qom-get", args))


def _up(ns: Netns, name: str, network: str, address: str) -> Machine:
    proc = ns.hpcvm("up", "--name", name, *VM, "--network", network, "--address", address)
    assert proc.returncode == 0, proc.stderr
    return state.load_machine(name)


def _check_connected(ns: Netns, machine: Machine, address: str) -> None:
    """Host-side tap in the bridge, QEMU's NIC, the guest's interface and pings agree."""
    (nic,) = machine.boot.nics
    tap = ns.link(nic.ifname)
    assert tap is not None, f"no tap {nic.ifname} in the namespace"
    assert tap["linkinfo"]["info_kind"] == "tun"
    assert tap.get("master") == BRIDGE
    assert tap["mtu"] == BRIDGE_MTU
    assert "UP" in tap["flags"]

    qemu_mac = _qemu_mac(machine)  # QEMU's own view of the NIC
    assert qemu_mac == nic.mac

    links = _guest_links(ns, machine.name)
    (eth,) = [ln for ln in links if ln["address"] == qemu_mac]
    assert eth["mtu"] == BRIDGE_MTU  # the bridge's, read by the namespace's ip
    inet = [f"{a['local']}/{a['prefixlen']}" for a in eth["addr_info"] if a["family"] == "inet"]
    assert inet == [address]
    assert "UP" in eth["flags"]

    guest_ip = address.split("/")[0]
    ping = ns.run("busybox", "ping", "-c", "1", "-W", "10", guest_ip)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    back = ns.hpcvm(
        "exec", machine.name, "--", BUSYBOX_IN_GUEST, "ping", "-c", "1", "-W", "10",
        HOST_ADDR.split("/")[0],
    )  # fmt: skip
    assert back.returncode == 0, back.stdout + back.stderr


def test_virtio_nic_on_a_bridge(runtime: Path, netns: Netns) -> None:
    machine = _up(netns, "net-virtio", f"bridge={BRIDGE}", "10.99.0.2/24")
    (nic,) = machine.boot.nics
    assert nic.model == "virtio"
    _check_connected(netns, machine, "10.99.0.2/24")

    ps = netns.hpcvm("ps", "--json")
    (row,) = json.loads(ps.stdout)
    assert row["addresses"] == ["10.99.0.2/24"]
    assert row["nics"][0]["mac"] == nic.mac

    verify = netns.hpcvm("verify", machine.name, "--json", timeout=600)
    checks = {c["name"]: c for c in json.loads(verify.stdout)["checks"]}
    for what in ("MTU", "up", "address"):
        assert checks[f"NIC {nic.mac} {what}"]["ok"], checks

    down = netns.hpcvm("down", machine.name)
    assert down.returncode == 0, down.stderr
    assert netns.link(nic.ifname) is None, "down left the tap"
    assert not (runtime / machine.name).exists()


def test_e1000_nic_and_a_crashed_qemu_leaves_no_tap(runtime: Path, netns: Netns) -> None:
    machine = _up(netns, "net-e1000", f"bridge={BRIDGE},model=e1000", "10.99.0.3/24")
    (nic,) = machine.boot.nics
    assert nic.model == "e1000" and not nic.vhost
    _check_connected(netns, machine, "10.99.0.3/24")

    assert machine.pid is not None
    os.kill(machine.pid, signal.SIGKILL)
    ps = netns.hpcvm("ps", "--json")  # finds the VM stale and cleans it
    (row,) = json.loads(ps.stdout)
    assert row["state"] == "stale"
    assert netns.link(nic.ifname) is None, "the tap outlived its QEMU"
    assert not (runtime / machine.name).exists()


NETGUARD_TABLE = ("table", "bridge", "hpcvm_netguard")
# Run by the guest's own Python (the host's, shared read-only): raw frames a guest's
# root can send. ARP replies for A's address from B's MAC and from a forged MAC, and an
# ICMP echo to the node from A's address, three rounds a second apart (the kernel takes
# one neighbour update a second).
FORGE = """
import socket, struct, sys, time
eth, own, victim, node = sys.argv[1:5]
mac = lambda t: bytes.fromhex(t.replace(":", ""))
BCAST, FORGED = mac("ff:ff:ff:ff:ff:ff"), "0a:66:66:66:66:66"
def arp(src, spa):
    body = struct.pack("!HHBBH", 1, 0x800, 6, 4, 2) + mac(src) + socket.inet_aton(spa)
    return BCAST + mac(src) + b"\\x08\\x06" + body + BCAST + socket.inet_aton(spa)
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    return ~(s + (s >> 16)) & 0xFFFF
def echo(src, dst):
    icmp = struct.pack("!BBHHH", 8, 0, 0, 1, 1)
    icmp = icmp[:2] + struct.pack("!H", csum(icmp)) + icmp[4:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 1, 0, 64, 1, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    return BCAST + mac(own) + b"\\x08\\x00" + ip + icmp
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((eth, 0))
for _ in range(3):
    for frame in (arp(FORGED, victim), arp(own, victim), arp(own, node), echo(victim, node)):
        s.send(frame)
    time.sleep(1.1)
"""


def _lladdr(ns: Netns, address: str, where: str | None = None) -> str | None:
    """The MAC the namespace's kernel (or guest ``where``'s) maps ``address`` to."""
    if where is None:
        out = ns.run("ip", "-j", "neigh", "show", address).stdout
    else:
        out = ns.hpcvm("exec", where, "--", "ip", "-j", "neigh", "show", address).stdout
    entries = json.loads(out or "[]")
    return str(entries[0].get("lladdr")) if entries else None


def _drops(ns: Netns) -> dict[str, int]:
    """Every named counter of the guard's table, by name (nft's own JSON)."""
    out = ns.run("nft", "-j", "list", "counters", *NETGUARD_TABLE).stdout
    items = json.loads(out or '{"nftables": []}')["nftables"]
    return {c["counter"]["name"]: int(c["counter"]["packets"]) for c in items if "counter" in c}


def _port_chains(ns: Netns) -> list[str]:
    out = ns.run("nft", "-j", "list", *NETGUARD_TABLE).stdout
    items = json.loads(out or '{"nftables": []}')["nftables"]
    names = [str(item["chain"]["name"]) for item in items if "chain" in item]
    return [name for name in names if name.startswith("port_")]


def _guest_ping(ns: Netns, name: str, address: str) -> subprocess.CompletedProcess[str]:
    return ns.hpcvm("exec", name, "--", BUSYBOX_IN_GUEST, "ping", "-c", "1", "-W", "10", address)


def test_a_guest_cannot_take_another_address_or_mac(runtime: Path, netns: Netns) -> None:
    """Issue 38: guest B (root in its own guest) takes A's address and the node's,
    sends gratuitous ARP and ARP replies for them, frames from a forged MAC and IPv4
    from A's address. Afterwards the node's neighbour entry for A is still A's MAC, A's
    entry for the node still the bridge's, every ping of the legitimate owners works,
    and B's tap's drop counters (nft's) say what was dropped while A's stay at zero.
    Then B's QEMU crashes: its rules outlive it only until the next call of the helper
    (A's down), which leaves no chain behind."""
    a = _up(netns, "guard-a", f"bridge={BRIDGE}", "10.99.0.21/24")
    b = _up(netns, "guard-b", f"bridge={BRIDGE}", "10.99.0.22/24")
    a_ip, b_ip, node_ip = "10.99.0.21", "10.99.0.22", HOST_ADDR.split("/")[0]
    a_mac, b_mac = _qemu_mac(a), _qemu_mac(b)
    bridge = netns.link(BRIDGE)
    assert bridge is not None
    indexes = {}
    for vm in (a, b):
        tap = netns.link(vm.boot.nics[0].ifname)
        assert tap is not None
        indexes[vm.name] = tap["ifindex"]
    assert sorted(_port_chains(netns)) == sorted(f"port_{i}" for i in indexes.values())
    assert netns.run("busybox", "ping", "-c", "1", "-W", "10", a_ip).returncode == 0
    assert _guest_ping(netns, a.name, node_ip).returncode == 0
    assert _lladdr(netns, a_ip) == a_mac
    assert _lladdr(netns, node_ip, where=a.name) == bridge["address"]

    (eth,) = [ln["ifname"] for ln in _guest_links(netns, b.name) if ln["address"] == b_mac]
    bb = BUSYBOX_IN_GUEST
    attack = (
        f"{bb} ip addr add {a_ip}/24 dev {eth}; {bb} ip addr add {node_ip}/24 dev {eth};"
        f" {bb} arping -U -c 3 -I {eth} -s {a_ip} {a_ip};"
        f" {bb} arping -A -c 3 -I {eth} -s {node_ip} {node_ip};"
        f" /usr/bin/python3 -c '{FORGE}' {eth} {b_mac} {a_ip} {node_ip};"
        f" {bb} ip addr del {a_ip}/24 dev {eth}; {bb} ip addr del {node_ip}/24 dev {eth}"
    )
    done = netns.hpcvm("exec", b.name, "--", bb, "sh", "-c", attack)
    assert done.returncode == 0, done.stdout + done.stderr

    assert _lladdr(netns, a_ip) == a_mac  # the kernel's view: A's address is A's
    assert _lladdr(netns, node_ip, where=a.name) == bridge["address"]
    assert netns.run("busybox", "ping", "-c", "1", "-W", "10", a_ip).returncode == 0
    assert netns.run("busybox", "ping", "-c", "1", "-W", "10", b_ip).returncode == 0
    assert _guest_ping(netns, a.name, node_ip).returncode == 0
    assert _guest_ping(netns, b.name, node_ip).returncode == 0  # B's own traffic flows
    drops = _drops(netns)
    b_port, a_port = f"port_{indexes[b.name]}", f"port_{indexes[a.name]}"
    for reason in ("mac", "arp", "ip"):
        assert drops[f"{b_port}_{reason}"] > 0, drops
        assert drops[f"{a_port}_{reason}"] == 0, drops  # A's legitimate traffic: no drop

    assert b.pid is not None
    os.kill(b.pid, signal.SIGKILL)
    for _ in range(50):  # the kernel removes the tap with QEMU's last descriptor
        if netns.link(b.boot.nics[0].ifname) is None:
            break
        time.sleep(0.1)
    assert b_port in _port_chains(netns)  # nothing has called the helper yet
    assert netns.hpcvm("down", a.name).returncode == 0
    assert _port_chains(netns) == []  # A's went with A, the crashed B's with that call
    assert netns.hpcvm("ps", "--json").returncode == 0  # B's record found stale, cleaned


@pytest.mark.parametrize(
    ("network", "address", "message"),
    [
        ("bridge=nosuchbr", "10.99.0.4/24", "bridge 'nosuchbr' does not exist"),
        ("bridge=lo", "10.99.0.4/24", "'lo' is not a bridge"),
        (f"bridge={BRIDGE}", "10.98.0.4/24", "outside brnt0's subnet 10.99.0.0/24"),
        (f"bridge={BRIDGE}", "10.99.0.1/24", "own address"),
        (f"bridge={BRIDGE},mtu=9000", "10.99.0.4/24", "above brnt0's MTU 1400"),
        ("tap=tap0", "10.99.0.4/24", "unknown key 'tap'"),
    ],
)
def test_refused_before_anything_starts(
    runtime: Path, netns: Netns, network: str, address: str, message: str
) -> None:
    proc = netns.hpcvm("up", "--name", "net-bad", *VM, "--network", network, "--address", address)
    assert proc.returncode == 2, proc.stderr
    assert message in one_line_error(proc)
    assert not (runtime / "net-bad").exists()
    assert _taps(netns) == []


def test_a_nic_the_guest_cannot_configure_fails_up(runtime: Path, netns: Netns) -> None:
    """e1000 takes at most a 16110-byte MTU (the guest driver's limit): on a bridge with
    MTU 65000 the guest's rc script fails to set it, and `up` must say so and tear the
    VM down rather than hand back a VM without its network."""
    jumbo = "brnt1"
    _ip("-n", netns.name, "link", "add", jumbo, "type", "bridge")
    try:
        _ip("-n", netns.name, "link", "set", jumbo, "mtu", "65000", "up")
        proc = netns.hpcvm(
            "up", "--name", "net-jumbo", *VM, "--network", f"bridge={jumbo},model=e1000",
            "--address", "10.97.0.2/24",
        )  # fmt: skip
        assert proc.returncode == 5, proc.stderr
        line = one_line_error(proc)
        assert "did not configure its network" in line and "MTU" in line
        assert not (runtime / "net-jumbo").exists()
        assert _taps(netns) == []
    finally:
        _ip("-n", netns.name, "link", "del", jumbo)


def test_an_address_someone_on_the_segment_answers_for_is_refused(
    runtime: Path, netns: Netns
) -> None:
    """Another host on the bridge (a second namespace, its veth in the bridge) holds
    10.99.0.9: a VM asked for that address probes it at boot (duplicate address
    detection), gets an answer, and `up` fails naming the address, tearing the VM down.
    The oracle: that namespace's own address, which its kernel answers ARP for."""
    other = Netns(f"{netns.name}-b")
    _ip("netns", "add", other.name)
    try:
        _ip("-n", netns.name, "link", "add", "vdad", "type", "veth", "peer", "name", "vdadb",
            "netns", other.name)  # fmt: skip
        _ip("-n", netns.name, "link", "set", "vdad", "master", BRIDGE, "up")
        _ip("-n", other.name, "addr", "add", "10.99.0.9/24", "dev", "vdadb")
        _ip("-n", other.name, "link", "set", "vdadb", "up")
        proc = netns.hpcvm(
            "up", "--name", "net-dad", *VM, "--network", f"bridge={BRIDGE}",
            "--address", "10.99.0.9/24",
        )  # fmt: skip
        assert proc.returncode == 5, proc.stderr
        line = one_line_error(proc)
        assert "10.99.0.9 is in use on the segment" in line, line
        assert not (runtime / "net-dad").exists()
        assert _taps(netns) == []
    finally:
        subprocess.run(["ip", "netns", "del", other.name], capture_output=True, check=False)
        subprocess.run(["ip", "-n", netns.name, "link", "del", "vdad"], capture_output=True)
