"""hpcvm-netguard's per-job isolation (``job-isolation on`` in its config), run for real
on taps made in a network namespace of the test's own, as test_netguard.py does: no VM.

The namespace's bridge br0 has the node's address (outside the VM range of the test's
config), three taps (VMs of this node) and a veth "uplink" (the segment: other nodes
and their VMs). Each tap is held by a child process that guards it with the built
helper, writes raw frames into it (what a guest's NIC sends) and reads what the bridge
delivers to it (what the guest would receive). Oracles: the frames the receiving tap
actually got from the kernel, and nft's listing (chains, sets, exact counter values).
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_netguard import BUILT, Netns, arp, bridged_netns

pytestmark = pytest.mark.integration

BRIDGE, NODE, OTHER_NODE = "br0", "10.96.0.1/24", "10.96.0.2"
VMS = "10.96.0.128/25"  # the config's VM range: the nodes' addresses lie outside it
ME, PEER, STRANGER = "10.96.0.130", "10.96.0.131", "10.96.0.132"  # VMs on this node
REMOTE_PEER, REMOTE_STRANGER = "10.96.0.140", "10.96.0.150"  # VMs on other nodes
MAC = {ME: "0a:00:00:00:01:30", PEER: "0a:00:00:00:01:31", STRANGER: "0a:00:00:00:01:32",
       REMOTE_PEER: "0a:00:00:00:01:40", REMOTE_STRANGER: "0a:00:00:00:01:50",
       OTHER_NODE: "0a:00:00:00:00:02"}  # fmt: skip
UPLINK = ("up0", "up1")  # up0 in the bridge; the test writes the segment's frames on up1
SITE_CONFIG = Path("/etc/hpcvm/site.toml")  # the helper's fallback for the VM ranges

# A child holding a tap (TUNSETIFF, in the bridge, up) or, with "packet NAME", a packet
# socket on an interface; commands on stdin, one JSON reply per line:
# ["run", argv] (``{fd}`` in argv: the tap's descriptor), ["send", [hex]], ["recv"]
# (the frames queued for the tap so far), ["exit"].
CHILD = r"""
import fcntl, json, os, socket, struct, subprocess, sys, time
if sys.argv[1] == "tap":
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    ifr = fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", b"", 0x0002 | 0x1000))
    name = ifr[:16].rstrip(b"\0").decode()
    for args in (["master", sys.argv[2]], ["up"]):
        subprocess.run(["ip", "link", "set", "dev", name, *args], check=True)
    write, read = (lambda b: os.write(fd, b)), (lambda: os.read(fd, 65536))
else:
    name = sys.argv[2]
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind((name, 0))
    write, read, fd = sock.send, None, -1
print(json.dumps({"name": name}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd[0] == "run":
        done = subprocess.run([a.replace("{fd}", str(fd)) for a in cmd[1]], pass_fds=[fd],
                              capture_output=True, text=True)
        reply = {"rc": done.returncode, "stderr": done.stderr}
    elif cmd[0] == "send":
        reply = {"sent": sum(write(bytes.fromhex(f)) > 0 for f in cmd[1])}
    elif cmd[0] == "recv":
        time.sleep(0.2)  # what the kernel still has in flight (a loaded machine)
        got = []
        while True:
            try:
                got.append(read().hex())
            except BlockingIOError:
                break
        reply = {"frames": got}
    else:
        break
    print(json.dumps(reply), flush=True)
"""


class Port:
    """A tap (or, with ``packet``, an interface's packet socket) held by a child process
    in the namespace (CHILD above), until ``close``."""

    def __init__(self, ns: Netns, packet: str | None = None) -> None:
        argv = ["/usr/bin/python3", "-c", CHILD, "packet" if packet else "tap", packet or BRIDGE]
        self.proc = subprocess.Popen(
            ns.argv(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.name: str = self._reply()["name"]
        self.index = ns.ifindex(self.name)

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"the port's child ended (exit {self.proc.wait(timeout=30)})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _ask(self, *cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def run(self, *argv: str) -> dict[str, Any]:
        return self._ask("run", list(argv))

    def send(self, frames: Sequence[bytes]) -> None:
        assert self._ask("send", [f.hex() for f in frames])["sent"] == len(frames)

    def received_from(self) -> set[tuple[str, str]]:
        """(source MAC, EtherType) of each frame the bridge delivered since last asked."""
        frames = [bytes.fromhex(f) for f in self._ask("recv")["frames"]]
        return {(f[6:12].hex(":"), f[12:14].hex()) for f in frames}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.communicate(json.dumps(["exit"]) + "\n", timeout=30)


def guard(config: Path, ip: str, *peers: str) -> list[str]:
    argv = [str(BUILT), "guard", "--config", str(config), "--fd", "{fd}"]
    argv += ["--mac", MAC[ip], "--ip", ip]
    return argv + [word for peer in peers for word in ("--peer", peer)]


def ipv4(src_mac: str, src_ip: str) -> bytes:
    """A broadcast IPv4 header with a correct checksum (br_netfilter, where loaded,
    drops a frame whose header is invalid before it reaches another port)."""
    header = bytearray([0x45, 0, 0, 20, 0, 1, 0, 0, 64, 17, 0, 0]) + socket.inet_aton(src_ip)
    header += socket.inet_aton("10.96.0.255")
    total = sum(int.from_bytes(header[i : i + 2], "big") for i in range(0, 20, 2))
    total = (total & 0xFFFF) + (total >> 16)
    header[10:12] = (~((total & 0xFFFF) + (total >> 16)) & 0xFFFF).to_bytes(2, "big")
    return b"\xff" * 6 + bytes.fromhex(src_mac.replace(":", "")) + b"\x08\x00" + header


def frames_of(ip: str, mac: str | None = None) -> list[bytes]:
    """What a VM (or host) at ``ip`` sends: an ARP reply and an IPv4 datagram."""
    return [arp(mac or MAC[ip], ip), ipv4(mac or MAC[ip], ip)]


def kinds(ip: str, mac: str | None = None) -> set[tuple[str, str]]:
    return {(mac or MAC[ip], "0806"), (mac or MAC[ip], "0800")}


@pytest.fixture(scope="module")
def netns() -> Iterator[Netns]:
    """The node's bridge with an uplink (a veth: where other nodes' frames come in)."""
    with bridged_netns(
        "hpcvm-iso",
        ["link", "add", UPLINK[0], "type", "veth", "peer", "name", UPLINK[1]],
        ["link", "set", UPLINK[0], "master", BRIDGE, "up"],
        ["link", "set", UPLINK[1], "up"],
    ) as ns:
        yield ns


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    """The admin's config with job isolation on (root's file, as the helper demands)."""
    path = tmp_path / "netguard.conf"
    path.write_text(f"bridge {BRIDGE}\nrange {VMS}\njob-isolation on\n")
    path.chmod(0o644)
    return path


@pytest.fixture()
def ports(netns: Netns) -> Iterator[dict[str, Port]]:
    """This node's three VMs' taps (unguarded yet) and the uplink; all closed after, and
    every tap's rules collected."""
    made: dict[str, Port] = {}
    try:
        for ip in (ME, PEER, STRANGER):
            made[ip] = Port(netns)
        made["uplink"] = Port(netns, packet=UPLINK[1])
        made["node"] = Port(netns, packet=BRIDGE)  # the node's own stack's frames
        yield made
    finally:
        for port in made.values():
            port.close()
        assert netns.run(str(BUILT), "gc").returncode == 0
        leftover = [item for item in netns.table() if _per_tap(item)]
        assert leftover == [], leftover


def _per_tap(item: dict[str, Any]) -> bool:
    for kind in ("chain", "set", "counter"):
        name = str(item.get(kind, {}).get("name", ""))
        if name.startswith(("port_", "in_")):
            return True
    return bool(item.get("map", {}).get("elem"))


def _node_mac(ns: Netns) -> str:
    out = ns.run("ip", "-j", "link", "show", "dev", BRIDGE).stdout
    return str(json.loads(out)[0]["address"])


def _send_all(netns: Netns, ports: dict[str, Port]) -> None:
    """Each VM and host sends its frames (broadcast: the bridge floods them to every
    port, so each reaches ME's tap unless a rule drops it)."""
    for ip in (PEER, STRANGER):
        ports[ip].send(frames_of(ip))
    ports["uplink"].send(
        frames_of(REMOTE_PEER) + frames_of(REMOTE_STRANGER) + frames_of(OTHER_NODE)
    )
    ports["node"].send(frames_of(NODE.split("/")[0], _node_mac(netns)))


def test_a_tap_receives_its_peers_and_the_nodes_and_no_other_jobs_vm(
    netns: Netns, ports: dict[str, Port], config: Path
) -> None:
    me = ports[ME]
    done = me.run(*guard(config, ME, PEER, REMOTE_PEER))
    assert done["rc"] == 0, done
    for ip in (PEER, STRANGER):  # the other VMs of this node: another job's each
        assert ports[ip].run(*guard(config, ip))["rc"] == 0
    me.received_from()  # nothing but what follows
    _send_all(netns, ports)
    got = me.received_from()
    for ip in (PEER, REMOTE_PEER, OTHER_NODE):  # its job's VMs, another node: through
        assert kinds(ip) <= got, (ip, got)
    assert kinds(NODE.split("/")[0], _node_mac(netns)) <= got  # the node's own: through
    for ip in (STRANGER, REMOTE_STRANGER):  # another job's VMs, here and there: dropped
        assert not kinds(ip) & got, (ip, got)
    counters = netns.counters()
    assert counters[f"in_{me.index}_job"] == 4  # STRANGER's two and REMOTE_STRANGER's two
    # STRANGER has no peers: it gets nothing from a VM, ME's job's or another's
    assert counters[f"in_{ports[STRANGER].index}_job"] == 6
    assert counters[f"port_{ports[STRANGER].index}_ip"] == 0  # it sent nothing forged
    assert {f"in_{me.index}", f"port_{me.index}"} <= {
        str(item["chain"]["name"]) for item in netns.table() if "chain" in item
    }


def test_peers_replaces_a_taps_peers_by_its_descriptor(
    netns: Netns, ports: dict[str, Port], config: Path
) -> None:
    """A job whose addresses are known only once all its VMs run (``--address auto``)
    sets them later: ``peers`` with the tap's descriptor, as ``guard`` takes it."""
    me = ports[ME]
    assert me.run(*guard(config, ME))["rc"] == 0
    assert ports[PEER].run(*guard(config, PEER))["rc"] == 0
    me.received_from()
    ports[PEER].send(frames_of(PEER))
    assert not kinds(PEER) & me.received_from()
    done = me.run(str(BUILT), "peers", "--config", str(config), "--fd", "{fd}", "--peer", PEER)
    assert done["rc"] == 0, done
    ports[PEER].send(frames_of(PEER))
    assert kinds(PEER) <= me.received_from()
    assert netns.counters()[f"in_{me.index}_job"] == 2  # the first two only
    # and back to none
    assert me.run(str(BUILT), "peers", "--config", str(config), "--fd", "{fd}")["rc"] == 0
    ports[PEER].send(frames_of(PEER))
    assert not kinds(PEER) & me.received_from()
    # a tap guarded before isolation was on has no peers to set: refused in one line
    stranger = ports[STRANGER]
    off = config.with_name("off.conf")
    off.write_text(f"bridge {BRIDGE}\nrange {VMS}\n")
    assert stranger.run(*guard(off, STRANGER))["rc"] == 0
    said = stranger.run(str(BUILT), "peers", "--config", str(config), "--fd", "{fd}")
    assert said["rc"] == 2, said
    assert said["stderr"] == (
        f"hpcvm-netguard: tap {stranger.name} has no job isolation: guard it first (its "
        "peers are set with its guard)\n"
    )


def test_off_by_default_every_vm_reaches_every_other_and_switching_off_opens_all(
    netns: Netns, ports: dict[str, Port], config: Path
) -> None:
    off = config.with_name("off.conf")
    off.write_text(f"bridge {BRIDGE}\nrange {VMS}\n")  # no job-isolation line
    me = ports[ME]
    assert me.run(*guard(off, ME, PEER))["rc"] == 0  # peers given: ignored
    assert ports[STRANGER].run(*guard(off, STRANGER))["rc"] == 0
    table = netns.table()
    names = {str(i[k]["name"]) for i in table for k in ("chain", "set") if k in i}
    assert not {f"in_{me.index}", f"in_{ports[STRANGER].index}"} & names
    assert [i for i in table if i.get("rule", {}).get("chain") == "forward"] == []
    me.received_from()
    ports[STRANGER].send(frames_of(STRANGER))
    assert kinds(STRANGER) <= me.received_from()
    # isolation on for a new guard of the same tap, then off again at the next call
    assert me.run(*guard(config, ME, PEER))["rc"] == 0
    ports[STRANGER].send(frames_of(STRANGER))
    assert not kinds(STRANGER) & me.received_from()
    assert netns.run(str(BUILT), "gc", "--config", str(off)).returncode == 0
    ports[STRANGER].send(frames_of(STRANGER))
    assert kinds(STRANGER) <= me.received_from()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["guard", "--fd", "0", "--mac", MAC[ME], "--peer", "10.96.0.300"], "not an IPv4"),
        (["guard", "--fd", "0", "--mac", MAC[ME], "--peer", "{ 1.2.3.4 }"], "not an IPv4"),
        (["guard", "--fd", "0", "--mac", MAC[ME], "--peer", "224.0.0.1"], "not a unicast"),
        (["guard", "--fd", "0", "--mac", MAC[ME], "--peer"], "--peer needs a value"),
        (["peers", "--fd", "0", "--mac", MAC[ME]], "peers takes only the tap and --peer"),
        (["peers", "--peer", PEER], "peers needs the tap"),
        (["release", "--fd", "0", "--peer", PEER], "release takes only the tap"),
        (["gc", "--peer", PEER], "gc takes no tap, MAC or address"),
        (["peers", "--fd", "0"], "descriptor 0 is not a tap"),
    ],
)
def test_a_bad_peer_request_is_refused_in_one_line(
    netns: Netns, argv: list[str], said: str
) -> None:
    before = netns.table()
    proc = netns.run(str(BUILT), *argv)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("hpcvm-netguard: ") and said in lines[0], lines[0]
    assert netns.table() == before


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("job-isolation yes\n", "line 1 is not 'bridge NAME'"),
        ("job-isolation on\n", "job-isolation on needs the VMs' ranges: an admin adds"),
    ],
)
def test_a_bad_isolation_config_is_refused(
    netns: Netns, tmp_path: Path, text: str, said: str
) -> None:
    if "ranges" in said and SITE_CONFIG.exists():
        pytest.skip(f"{SITE_CONFIG} exists: its pool would be the ranges")
    path = tmp_path / "netguard.conf"
    path.write_text(text)
    path.chmod(0o644)
    before = netns.table()
    proc = netns.run(str(BUILT), "gc", "--config", str(path))
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert said in proc.stderr
    assert netns.table() == before
