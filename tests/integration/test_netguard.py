"""hpcvm-netguard (csrc/hpcvm-netguard.c), the built binary run for real: its refusals,
and the frames a guarded, an unguarded and a gone tap let through, in a network
namespace of the test's own with a bridge br0 (the name the node's bridge ACL allows).

No VM: a child process in the namespace makes the tap (as root with TUNSETIFF; as the
test user with QEMU's setuid bridge helper, as hpcvm does), hands its descriptor to
the helper and writes raw frames into it, which is what a guest's NIC does. Oracles:
nft's own listing of the table (chains, map elements, named counters, exact packet
counts per reason), and the helper's exit status and one line on stderr. The
end-to-end test with guests is in test_network_bridge.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import cluster_support
from tests.cluster_support import TEST_USER, LocalCluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "src" / "hpcvm" / "data" / "hpcvm-netguard"
INSTALLED = Path("/usr/local/lib/hpcvm/hpcvm-netguard")  # scripts/install-node.sh's
# the test user exists while the Slurm test cluster is up (scripts/test-cluster.sh)
slurm_cluster = cluster_support.slurm_cluster
BRIDGE_HELPER = "/usr/lib/qemu/qemu-bridge-helper"
BRIDGE, NODE = "br0", "10.96.0.1/24"
TABLE = ("table", "bridge", "hpcvm_netguard")
MAC, OTHER_MAC = "0a:00:00:00:00:11", "0a:00:00:00:00:22"
IP, OTHER_IP = "10.96.0.11", "10.96.0.22"

# The child: makes a tap (``root``: TUNSETIFF; ``user``: QEMU's bridge helper), puts
# it in the bridge and up (root; the bridge helper does both itself), runs the helper
# command with ``{fd}`` replaced by the tap's descriptor, writes the frames, prints one
# JSON line and waits for a line on stdin before it exits (and the tap goes with it).
CHILD = r"""
import fcntl, json, os, socket, struct, subprocess, sys
mode, bridge, frames, command = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
if mode == "root":
    fd = os.open("/dev/net/tun", os.O_RDWR)
    ifr = fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", b"", 0x0002 | 0x1000))
    name = ifr[:16].rstrip(b"\0").decode()
    for args in (["master", bridge], ["up"]):
        subprocess.run(["ip", "link", "set", "dev", name, *args], check=True)
else:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    subprocess.run([HELPER, f"--br={bridge}", f"--fd={theirs.fileno()}"],
                   pass_fds=[theirs.fileno()], check=True)
    fd = socket.recv_fds(ours, 1, 1)[1][0]
    name = fcntl.ioctl(fd, 0x800454D2, bytes(40))[:16].rstrip(b"\0").decode()
helper = subprocess.run([a.replace("{fd}", str(fd)) for a in command], pass_fds=[fd],
                        capture_output=True, text=True)
sent = 0
for frame in frames:
    os.write(fd, bytes.fromhex(frame))
    sent += 1
print(json.dumps({"tap": name, "rc": helper.returncode, "stderr": helper.stderr,
                  "sent": sent}), flush=True)
sys.stdin.readline()
""".replace("HELPER", repr(BRIDGE_HELPER))


@dataclass(frozen=True)
class Netns:
    name: str

    def run(self, *argv: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(argv, user), capture_output=True, text=True, timeout=60, check=False
        )

    def argv(self, argv: Sequence[str], user: str | None = None) -> list[str]:
        runas = ["runuser", "-u", user, "--"] if user else []
        return ["nsenter", f"--net=/run/netns/{self.name}", *runas, *argv]

    def table(self) -> list[dict[str, Any]]:
        proc = self.run("nft", "-j", "list", *TABLE)
        return list(json.loads(proc.stdout or '{"nftables": []}')["nftables"])

    def chains(self) -> list[str]:
        names = [str(item["chain"]["name"]) for item in self.table() if "chain" in item]
        return [name for name in names if name.startswith("port_")]

    def counters(self) -> dict[str, int]:
        items = self.table()
        return {c["counter"]["name"]: int(c["counter"]["packets"]) for c in items if "counter" in c}

    def ifindex(self, name: str) -> int:
        out = self.run("ip", "-j", "link", "show", "dev", name).stdout
        return int(json.loads(out)[0]["ifindex"])


@contextlib.contextmanager
def bridged_netns(prefix: str, *more: Sequence[str]) -> Iterator[Netns]:
    """A network namespace with the node's bridge (and the ``ip`` commands ``more``),
    removed with everything in it afterwards; skips where the helper cannot run."""
    if os.geteuid() != 0 or not BUILT.exists() or shutil.which("nft") is None:
        pytest.skip(f"needs root, nft and {BUILT} (make all; scripts/setup.sh)")
    ns = Netns(f"{prefix}-{os.getpid()}")
    subprocess.run(["ip", "netns", "add", ns.name], check=True)
    try:
        for argv in (
            ["link", "add", BRIDGE, "type", "bridge"],
            ["addr", "add", NODE, "dev", BRIDGE],
            ["link", "set", BRIDGE, "up"],
            *more,
        ):
            subprocess.run(["ip", "-n", ns.name, *argv], check=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns.name], check=False)


@pytest.fixture(scope="module")
def netns() -> Iterator[Netns]:
    with bridged_netns("hpcvm-guard") as ns:
        yield ns


class Tap:
    """A tap held by a child process in the namespace (module doc), until ``close``."""

    def __init__(
        self,
        ns: Netns,
        command: Sequence[str],
        frames: Sequence[bytes] = (),
        user: str | None = None,
    ) -> None:
        python = "/usr/bin/python3"  # Debian's: the test user can run it
        argv = [python, "-c", CHILD, "user" if user else "root", BRIDGE,
                json.dumps([f.hex() for f in frames]), *command]  # fmt: skip
        self.proc = subprocess.Popen(
            ns.argv(argv, user), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            _, err = self.proc.communicate(timeout=30)
            pytest.fail(f"the tap's child failed: {err}")
        self.result: dict[str, Any] = json.loads(line)
        self.name: str = self.result["tap"]
        self.index = ns.ifindex(self.name)

    def close(self) -> None:
        self.proc.communicate("\n", timeout=30)


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def _ip(text: str) -> bytes:
    return bytes(int(part) for part in text.split("."))


def arp(src_mac: str, sender_ip: str, op: int = 2) -> bytes:
    body = bytes([0, 1, 8, 0, 6, 4, 0, op]) + _mac(src_mac) + _ip(sender_ip)
    return b"\xff" * 6 + _mac(src_mac) + b"\x08\x06" + body + b"\xff" * 6 + _ip(sender_ip)


def ipv4(src_mac: str, src_ip: str) -> bytes:
    header = bytes([0x45, 0, 0, 20, 0, 1, 0, 0, 64, 17, 0, 0]) + _ip(src_ip) + _ip("10.96.0.1")
    return b"\xff" * 6 + _mac(src_mac) + b"\x08\x00" + header


def ipv6(src_mac: str) -> bytes:
    return b"\x33\x33\x00\x00\x00\x01" + _mac(src_mac) + b"\x86\xdd" + bytes(40)


def guard(*args: str, helper: Path = BUILT) -> list[str]:
    return [str(helper), "guard", "--fd", "{fd}", *args]


def test_a_guarded_tap_passes_its_own_frames_and_counts_each_other_kind(netns: Netns) -> None:
    frames = [
        arp(MAC, IP),  # its own: through
        ipv4(MAC, IP),  # its own: through
        arp(MAC, "0.0.0.0", op=1),  # an address probe: through
        arp(OTHER_MAC, IP),  # another MAC: mac
        arp(MAC, OTHER_IP),  # an ARP reply for another address: arp
        arp(MAC, NODE.split("/")[0]),  # ... for the node's: arp
        arp(MAC, "0.0.0.0", op=2),  # a reply from 0.0.0.0: arp
        ipv4(MAC, OTHER_IP),  # IPv4 from another address: ip
        ipv6(MAC),  # IPv6: ip6
        _mac("ff:ff:ff:ff:ff:ff") + _mac(MAC) + b"\x81\x00" + bytes(46),  # a VLAN tag: other
    ]
    tap = Tap(netns, guard("--mac", MAC, "--ip", IP), frames)
    try:
        assert tap.result["rc"] == 0, tap.result
        assert tap.result["sent"] == len(frames)
        drops = netns.counters()
        port = f"port_{tap.index}"
        assert {k: v for k, v in drops.items() if k.startswith(port)} == {
            f"{port}_mac": 1, f"{port}_arp": 3, f"{port}_ip": 1, f"{port}_ip6": 1,
            f"{port}_other": 1,
        }  # fmt: skip
        assert drops["unguarded"] == 0
        assert netns.chains() == [port]
        # a second VM may have neither its MAC nor its address, nor the node's
        for args, said in (
            (
                ("--mac", MAC, "--ip", OTHER_IP),
                f"MAC {MAC} is already another VM's (tap {tap.name})",
            ),
            (("--mac", OTHER_MAC, "--ip", IP), f"address {IP} is already another VM's"),
            (("--mac", OTHER_MAC, "--ip", NODE.split("/")[0]), "is the node's own (br0)"),
        ):
            other = Tap(netns, guard(*args))
            other.close()
            assert other.result["rc"] == 2 and said in other.result["stderr"], other.result
    finally:
        tap.close()
    assert netns.chains() == [port]  # the tap is gone; its rules wait for the next call
    done = netns.run(str(BUILT), "gc")
    assert done.returncode == 0, done.stderr
    assert netns.chains() == []
    assert all(not item.get("map", {}).get("elem") for item in netns.table())


def test_an_unguarded_tap_carries_nothing_and_a_new_tap_never_inherits_rules(
    netns: Netns,
) -> None:
    """Rules follow the tap's ifindex, not its name: a tap made later under a name a
    guarded tap had is unguarded until guarded itself."""
    first = Tap(netns, guard("--mac", MAC, "--ip", IP))
    first.close()
    before = netns.counters()["unguarded"]
    tap = Tap(netns, ["true"], [arp(MAC, IP), ipv4(MAC, IP)])
    try:
        assert tap.result["rc"] == 0
        assert tap.name == first.name  # the kernel gave the name again
        assert netns.counters()["unguarded"] - before == 2  # even frames that would pass
    finally:
        tap.close()
    assert netns.run(str(BUILT), "gc").returncode == 0
    assert netns.chains() == []


def test_release_drops_a_live_taps_rules(netns: Netns) -> None:
    tap = Tap(netns, guard("--mac", MAC, "--ip", IP))
    try:
        assert tap.result["rc"] == 0
        done = netns.run(str(BUILT), "release", "--ifname", tap.name)
        assert done.returncode == 0, done.stderr
        assert netns.chains() == []
    finally:
        tap.close()


NINE_IPS = [word for i in range(10, 19) for word in ("--ip", f"10.96.0.{i}")]


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        ([], 2, "usage: hpcvm-netguard guard --fd N"),
        (["add-rule", "x"], 2, "unknown verb 'add-rule'"),
        (["guard", "--ifname", "nosuch0", "--mac", MAC], 2, "no interface nosuch0"),
        (["guard", "--ifname", BRIDGE, "--mac", MAC], 2, "br0 is not a tap (its kind is 'bridge')"),
        (["guard", "--ifname", "lo", "--mac", MAC], 2, "lo is not a tap"),
        (["guard", "--ifname", "a;b", "--mac", MAC], 2, "--ifname 'a;b' is not an interface"),
        (["guard", "--fd", "0", "--mac", MAC], 2, "descriptor 0 is not a tap"),
        (["guard", "--fd", "x", "--mac", MAC], 2, "--fd 'x' is not a descriptor number"),
        (["guard", "--fd", "0"], 2, "guard needs --mac"),
        (["guard", "--fd", "0", "--mac", "0a:00:00:00:00"], 2, "is not a MAC"),
        (["guard", "--fd", "0", "--mac", "0a:00:00:00:00:1g"], 2, "is not a MAC"),
        (["guard", "--fd", "0", "--mac", MAC, "--ip", "10.96.0.300"], 2, "not an IPv4 address"),
        (["guard", "--fd", "0", "--mac", MAC, "--ip", "{ 1.2.3.4 }"], 2, "not an IPv4 address"),
        (["guard", "--fd", "0", "--mac", MAC, "--ip"], 2, "--ip needs a value"),
        (["guard", "--fd", "0", "--mac", MAC, *NINE_IPS], 2, "at most 8 --ip per tap"),
        (["guard", "--fd", "0", "--mac", MAC, "--ip", IP, "--ip", IP], 2, "given twice"),
        (["guard", "--fd", "0", "--mac", MAC, "--ip", "224.0.0.1"], 2, "not a unicast address"),
        (["gc", "--mac", MAC], 2, "gc takes no tap, MAC or address"),
        (["release", "--fd", "0", "--ip", IP], 2, "release takes only the tap"),
        (["guard", "--fd", "0", "--mac", MAC, "--nft", "flush ruleset"], 2, "unknown option"),
    ],
)
def test_refused_in_one_line(netns: Netns, argv: list[str], code: int, said: str) -> None:
    before = netns.table()
    proc = netns.run(str(BUILT), *argv)
    assert proc.returncode == code
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcvm-netguard: "), proc.stderr
    assert said in lines[0], lines[0]
    assert netns.table() == before


@pytest.mark.parametrize(
    ("mac", "address", "said"),
    [
        ("0b:00:00:00:00:11", IP, "--mac must be a unicast MAC"),
        ("00:00:00:00:00:00", IP, "--mac must be a unicast MAC"),
        (MAC, NODE.split("/")[0], "address 10.96.0.1 is the node's own (br0)"),
    ],
)
def test_a_mac_or_address_no_vm_may_have_is_refused(
    netns: Netns, mac: str, address: str, said: str
) -> None:
    """Root's VMs too (the ranges of the admin's config bind users: the user test)."""
    tap = Tap(netns, guard("--mac", mac, "--ip", address))
    tap.close()
    assert tap.result["rc"] == 2 and said in tap.result["stderr"], tap.result
    assert netns.chains() == []


def test_a_tap_of_another_network_namespace_is_refused(netns: Netns) -> None:
    """A user may make a tap in a namespace of their own (user namespaces), named like
    another user's tap here: the helper refuses a descriptor whose tap is not in its
    own namespace, before it looks the name up."""
    other = Netns(f"{netns.name}-x")
    subprocess.run(["ip", "netns", "add", other.name], check=True)
    try:
        subprocess.run(["ip", "-n", other.name, "link", "add", BRIDGE, "type", "bridge"],
                       check=True)  # fmt: skip
        before = netns.table()
        here = [*netns.argv([]), *guard("--mac", MAC, "--ip", IP)]
        tap = Tap(other, here)  # made in `other`, the helper run in `netns`
        tap.close()
        assert tap.result["rc"] == 2, tap.result
        assert "is not in this helper's network namespace" in tap.result["stderr"]
        assert netns.table() == before
    finally:
        subprocess.run(["ip", "netns", "del", other.name], check=False)


def test_a_config_others_may_write_is_refused(netns: Netns, tmp_path: Path) -> None:
    config = tmp_path / "netguard.conf"
    config.write_text("bridge br0\n")
    config.chmod(0o666)
    proc = netns.run(str(BUILT), "gc", "--config", str(config))
    assert proc.returncode == 1
    assert "writable by root alone" in proc.stderr
    config.chmod(0o644)
    config.write_text("allow all\n")
    proc = netns.run(str(BUILT), "gc", "--config", str(config))
    assert proc.returncode == 1 and "line 1 is not 'bridge NAME'" in proc.stderr


def test_a_user_guards_their_own_tap_through_the_installed_grant(
    netns: Netns, slurm_cluster: LocalCluster
) -> None:
    """The test user (group hpcvm) gets a tap from QEMU's bridge helper and guards it
    with the installed setuid helper (scripts/install-node.sh; scripts/setup.sh makes
    this machine a node): root's options are refused to them, their uid is in the
    rules' log prefix, and the address must lie in the bridge's subnet. (The test user
    comes with the Slurm test cluster: hence its fixture.)"""
    info = INSTALLED.stat() if INSTALLED.exists() else None
    if info is None or not info.st_mode & 0o4000 or info.st_uid != 0:
        pytest.skip(f"{INSTALLED} is not installed setuid root: scripts/install-node.sh")
    uid = int(subprocess.run(["id", "-u", TEST_USER], capture_output=True, text=True,
                             check=True).stdout)  # fmt: skip
    outside = Tap(netns, guard("--mac", MAC, "--ip", "10.95.0.11", helper=INSTALLED),
                  user=TEST_USER)  # fmt: skip
    outside.close()
    assert outside.result["rc"] == 2, outside.result
    assert "outside the ranges the admin allows on br0" in outside.result["stderr"]
    tap = Tap(netns, guard("--mac", MAC, "--ip", IP, helper=INSTALLED), [ipv4(MAC, OTHER_IP)],
              user=TEST_USER)  # fmt: skip
    try:
        assert tap.result["rc"] == 0, tap.result
        listing = netns.run("nft", "list", "chain", "bridge", "hpcvm_netguard", f"port_{tap.index}")
        assert f'log prefix "hpcvm-netguard uid={uid} {tap.name} ip: "' in listing.stdout
        assert netns.counters()[f"port_{tap.index}_ip"] == 1
        by_name = netns.run(str(INSTALLED), "release", "--ifname", tap.name, user=TEST_USER)
        assert by_name.returncode == 2 and "--ifname is for root only" in by_name.stderr
        assert netns.chains() == [f"port_{tap.index}"]
    finally:
        tap.close()
    assert netns.run(str(INSTALLED), "gc", user=TEST_USER).returncode == 0
    assert netns.chains() == []
