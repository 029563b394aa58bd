"""The network attempts of the two-user test (tests/integration/test_two_users.py, issue
38): on the node of the first user's job VM, the second user boots a VM of their own on
that node's bridge (unprivileged: QEMU's bridge helper and the installed
hpcvm-netguard, the grants a site gives its users) and, root in that guest, tries to
take the job VM's address, the node's and the controller's (``ip addr add``,
gratuitous ARP, ARP replies), to send from the job VM's MAC and a forged one, and
IPv4 from the job VM's address.

The attack and the oracles are test_network_bridge's (its raw-frame script, its reads
of the neighbour table and of nft's chains and counters), run here in the test
cluster's namespaces: the node's neighbour table and bridge forwarding table, the
controller's neighbour table (the switch namespace), nft's counters in the node's
namespace as root (the admin), QEMU's own MAC of the job VM (QMP). Nothing is taken
from hpcvm's answers but the records' names (tap, MAC, address), which these confirm.
"""

from __future__ import annotations

import json
import pwd
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from tests import cluster_support
from tests.integration.test_network_bridge import (
    BUSYBOX_IN_GUEST,
    FORGE,
    VM,
    Netns,
    _drops,
    _lladdr,
    _port_chains,
    _qemu_mac,
)
from tests.sites import default_runtime_root

# The attacker's own address: in the nodes' /24 (what the helper allows on br0), below
# the sites' pool (its upper half, tests/sites.py) and none of a node's or the
# controller's. Held by anyone on the segment, the attacker's `up` fails (its guest's
# duplicate address detection) rather than the test going on with a shared address.
ATTACKER_HOST = 100
BOOT_TIMEOUT = 600.0  # one TCG boot beside the job's VMs on a 2-core machine
# A TCG guest whose PU other jobs share can leave echoes unanswered for many seconds:
# ``reach`` pings until one is answered or REACH_TIMEOUT has passed.
PING = ("-c", "1", "-W", "5")
REACH_TIMEOUT = 120.0


@dataclass
class SegmentAttempt:
    """What the second user's guest did on the job's node, and what the oracles read
    before and after (``attempt``)."""

    node: str
    attacker: str  # the attacker's VM's name
    victim_ip: str = ""
    victim_mac: str = ""  # QEMU's own (QMP)
    victim_tap: str = ""
    attacker_ip: str = ""
    attacker_mac: str = ""
    victim_chain: str = ""  # the taps' chains in the guard's table (``guard_chain``)
    attacker_chain: str = ""
    up: subprocess.CompletedProcess[str] | None = None
    attack: subprocess.CompletedProcess[str] | None = None
    own_ping: subprocess.CompletedProcess[str] | None = None
    before: dict[str, str | None] = field(default_factory=dict)  # "who: whose" -> MAC
    after: dict[str, str | None] = field(default_factory=dict)
    fdb_before: str | None = None  # the port the node's bridge sends the victim's MAC to
    fdb_after: str | None = None
    drops: dict[str, int] = field(default_factory=dict)  # nft's named counters
    chains: list[str] = field(default_factory=list)  # guarded taps' chains, attacker's up


def guard_chain(cluster: cluster_support.LocalCluster, owner: int, vm: str, node: str) -> str:
    """The chain hpcvm-netguard must have made for VM ``vm``'s tap on ``node`` (uid
    ``owner``'s): ``port_<ifindex>``, the ifindex the node's kernel gives the tap the
    VM's record names (checked to be a tap in the node's bridge)."""
    machine = _record(owner, vm)
    link = _link(_namespace(cluster, node), machine.boot.nics[0].ifname)
    assert link["linkinfo"]["info_kind"] == "tun" and link.get("master") == "br0", link
    return f"port_{link['ifindex']}"


def node_chains(cluster: cluster_support.LocalCluster, node: str) -> list[str]:
    """The per-tap chains of the guard's table in ``node``'s namespace (nft's own)."""
    return _port_chains(_namespace(cluster, node))


@dataclass(frozen=True)
class Attacker:
    """The second user on the job's node: their own ``hpcvm`` (the site's venv) run in
    the node's namespace as a user logged in there would, and their VM ``name``."""

    cluster: cluster_support.LocalCluster
    hpcvm: Path
    user: str
    node: str
    name: str

    def hpcvm_run(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(self.hpcvm), *args]
        return self.cluster.run(
            argv, node=self.node, user=self.user, timeout=BOOT_TIMEOUT, check=False
        )

    def in_guest(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``argv`` run in the attacker's guest, as its root (``hpcvm exec``)."""
        return self.hpcvm_run("exec", self.name, "--", *argv)

    def up(self, address: str) -> subprocess.CompletedProcess[str]:
        net = ["--network", "bridge=br0", "--address", f"{address}/24"]
        return self.hpcvm_run("up", "--name", self.name, *VM, *net)

    def down(self) -> None:
        """The attacker's VM down (their own ``hpcvm down``), whatever happened."""
        self.hpcvm_run("down", self.name, "--timeout", "10")

    def eth(self, mac: str) -> str:
        """The guest's interface with ``mac`` (the guest's own ``ip``)."""
        links = self.in_guest("ip", "-j", "link")
        assert links.returncode == 0, links.stderr
        (name,) = [ln["ifname"] for ln in json.loads(links.stdout) if ln["address"] == mac]
        return str(name)


def attempt(attacker: Attacker, seen: SegmentAttempt, victim_uid: int, victim_vm: str) -> None:
    """The whole network attempt, recorded in ``seen``: the oracles' first reads, the
    attacker's VM up, the attack from inside it, the oracles' second reads, then the
    attacker's own ping to the node. The caller takes the attacker's VM down."""
    cluster, node = attacker.cluster, attacker.node
    victim = _record(victim_uid, victim_vm)
    seen.victim_ip = str(victim.boot.nics[0].address).split("/")[0]
    seen.victim_mac, seen.victim_tap = _qemu_mac(victim), victim.boot.nics[0].ifname
    node_ip = next(n.address for n in cluster.nodes if n.name == node)
    ns, views = _views(cluster, node, seen.victim_ip)
    seen.before = {label: _lladdr(where, address) for label, (where, address) in views.items()}
    seen.fdb_before = _fdb_port(ns, seen.victim_mac)

    seen.attacker_ip = f"{cluster_support.NET_PREFIX}.{ATTACKER_HOST}"
    seen.up = attacker.up(seen.attacker_ip)
    if seen.up.returncode != 0:
        return
    attacker_uid = pwd.getpwnam(attacker.user).pw_uid
    seen.attacker_mac = _qemu_mac(_record(attacker_uid, attacker.name))
    seen.attacker_chain = guard_chain(cluster, attacker_uid, attacker.name, node)
    seen.victim_chain = guard_chain(cluster, victim_uid, victim_vm, node)
    seen.chains = node_chains(cluster, node)
    script = _attack_script(
        seen, attacker.eth(seen.attacker_mac), node_ip, cluster.controller_address
    )
    seen.attack = attacker.in_guest(BUSYBOX_IN_GUEST, "sh", "-c", script)

    seen.after = {label: _lladdr(where, address) for label, (where, address) in views.items()}
    seen.fdb_after = _fdb_port(ns, seen.victim_mac)
    seen.drops = _drops(ns)
    seen.own_ping = reach(lambda: attacker.in_guest(BUSYBOX_IN_GUEST, "ping", *PING, node_ip))


def _views(
    cluster: cluster_support.LocalCluster, node: str, victim_ip: str
) -> tuple[Netns, dict[str, tuple[Netns, str]]]:
    """The node's namespace, and the neighbour entries the oracles read: the node's for
    the victim's VM and the controller, the controller's for the node and the victim's
    VM; each made now (a ping), so that a forged announcement would have one to change."""
    ns, switch = _namespace(cluster, node), Netns(cluster_support.SWITCH_NAMESPACE)
    node_ip = next(n.address for n in cluster.nodes if n.name == node)
    views = {
        "node: victim": (ns, victim_ip),
        "node: controller": (ns, cluster.controller_address),
        "controller: node": (switch, node_ip),
        "controller: victim": (switch, victim_ip),
    }
    for label, (where, address) in views.items():
        ping = reach(lambda: where.run("busybox", "ping", *PING, address))  # noqa: B023
        assert ping.returncode == 0, (label, ping.stdout + ping.stderr)
    return ns, views


def _attack_script(seen: SegmentAttempt, eth: str, node_ip: str, ctl_ip: str) -> str:
    """Run by the attacker's guest's shell as its root: the three addresses taken,
    announced (gratuitous ARP, unsolicited ARP replies), then test_network_bridge's raw
    frames, once from the attacker's own MAC (ARP replies for the victim's address and
    the node's, IPv4 from the victim's address) and once from the victim's MAC (the same
    frames for the victim's address and the controller's), then the addresses dropped.
    Joined by ``;`` as there: arping's status says nothing about what it sent."""
    bb, victim = BUSYBOX_IN_GUEST, seen.victim_ip
    steps = [f"{bb} ip addr add {a}/24 dev {eth}" for a in (victim, node_ip, ctl_ip)]
    steps += [f"{bb} arping -U -c 3 -I {eth} -s {victim} {victim}"]
    steps += [f"{bb} arping -A -c 3 -I {eth} -s {a} {a}" for a in (node_ip, ctl_ip)]
    steps += [
        f"/usr/bin/python3 -c '{FORGE}' {eth} {seen.attacker_mac} {victim} {node_ip}",
        f"/usr/bin/python3 -c '{FORGE}' {eth} {seen.victim_mac} {victim} {ctl_ip}",
    ]
    steps += [f"{bb} ip addr del {a}/24 dev {eth}" for a in (victim, node_ip, ctl_ip)]
    return "; ".join(steps)


def reach(ping: Callable[[], subprocess.CompletedProcess[str]]) -> subprocess.CompletedProcess[str]:
    """``ping`` again until it succeeds or REACH_TIMEOUT has passed; its last answer."""
    deadline = time.monotonic() + REACH_TIMEOUT
    done = ping()
    while done.returncode != 0 and time.monotonic() < deadline:
        done = ping()
    return done


def _namespace(cluster: cluster_support.LocalCluster, node: str) -> Netns:
    return Netns(next(n.namespace for n in cluster.nodes if n.name == node))


def _record(uid: int, vm: str) -> Machine:
    """VM ``vm``'s record, read as root from its user's runtime directory."""
    machine = state.read_machine(default_runtime_root(uid) / vm)
    assert machine is not None, f"no record of {vm} (uid {uid})"
    return machine


def _link(ns: Netns, name: str) -> dict[str, Any]:
    link = ns.link(name)
    assert link is not None, f"no link {name} in {ns.name}"
    return link


def _fdb_port(ns: Netns, mac: str) -> str | None:
    """The port the node's bridge forwards ``mac`` to (the kernel's forwarding table)."""
    out = ns.run("bridge", "-j", "fdb", "show", "br", "br0").stdout
    ports = {str(e["ifname"]) for e in json.loads(out or "[]") if e.get("mac") == mac}
    return ports.pop() if len(ports) == 1 else ",".join(sorted(ports)) or None
