"""``--network macvtap=PARENT`` with real parts: a veth pair of the test's own, its one end
(the parent) in a namespace where hpcvm runs (``nsenter --net``, as the test cluster's
nodes run, so hpcvm must find the macvtap's device number without the host's sysfs),
its other end in a second namespace that plays "another host on the wire" with
10.98.0.1/24. The built-in guest under TCG, 1 vCPU, 256 MiB.

Oracles: the namespaces' own links (``ip -j -d``: the macvtap, its parent, mode, MAC,
MTU), QMP (``qom-get`` of the NIC's MAC), pings both ways between the guest and the
other namespace (a macvtap guest is reached from the wire, not from its own host's
parent: that is macvtap's design), and the links after ``down`` and after a crash.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from tests.integration.test_network_bridge import BUSYBOX_IN_GUEST, VM, Netns, _qemu_mac
from tests.runtime_support import isolated_runtime, one_line_error

pytestmark = pytest.mark.integration

PARENT = "mvp0"
PEER = "mvp1"
PEER_ADDR = "10.98.0.1/24"
PARENT_MTU = 1400  # not 1500: the guest's MTU must come from the parent


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def wire() -> Iterator[tuple[Netns, Netns]]:
    """(where hpcvm runs, the other end of the wire); both deleted at the end."""
    here = Netns(f"hpcvm-mvt-{os.getpid()}")
    there = Netns(f"hpcvm-mvp-{os.getpid()}")
    try:
        for ns in (here, there):
            _ip("netns", "add", ns.name)
            _ip("-n", ns.name, "link", "set", "lo", "up")
        _ip("-n", here.name, "link", "add", PARENT, "type", "veth", "peer", "name", PEER,
            "netns", there.name)  # fmt: skip
        _ip("-n", here.name, "link", "set", PARENT, "mtu", str(PARENT_MTU), "up")
        _ip("-n", there.name, "link", "set", PEER, "mtu", str(PARENT_MTU), "up")
        _ip("-n", there.name, "addr", "add", PEER_ADDR, "dev", PEER)
        yield here, there
    finally:
        for ns in (here, there):
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, check=False)


@pytest.fixture
def runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guest: None, wire: tuple[Netns, Netns]
) -> Iterator[Path]:
    with isolated_runtime(
        tmp_path, monkeypatch, lambda: wire[0].hpcvm("down", "--all", "--timeout", "10")
    ) as root:
        yield root
    assert _macvtaps(wire[0]) == [], "a macvtap was left in the namespace"


def _macvtaps(ns: Netns) -> list[str]:
    return [ln["ifname"] for ln in ns.links() if _kind(ln) == "macvtap"]


def _kind(info: dict[str, Any]) -> str:
    return str(info.get("linkinfo", {}).get("info_kind", ""))


def test_macvtap_guest_is_on_the_wire_and_its_link_goes_with_it(
    runtime: Path, wire: tuple[Netns, Netns]
) -> None:
    here, there = wire
    proc = here.hpcvm(
        "up", "--name", "mvt", *VM, "--network", f"macvtap={PARENT}", "--address", "10.98.0.2/24"
    )
    assert proc.returncode == 0, proc.stderr
    machine = state.load_machine("mvt")
    (nic,) = machine.boot.nics
    tap = here.link(nic.ifname)
    assert tap is not None, f"no macvtap {nic.ifname} in the namespace"
    assert _kind(tap) == "macvtap"
    assert tap["linkinfo"]["info_data"]["mode"] == "bridge"
    assert tap["link"] == PARENT
    assert tap["address"] == nic.mac == _qemu_mac(machine)  # the kernel's and QEMU's views
    assert tap["mtu"] == PARENT_MTU
    guest = json.loads(here.hpcvm("exec", "mvt", "--", "ip", "-j", "addr", "show").stdout)
    (eth,) = [ln for ln in guest if ln["address"] == nic.mac]
    assert eth["mtu"] == PARENT_MTU
    ping = there.run("busybox", "ping", "-c", "1", "-W", "10", "10.98.0.2")
    assert ping.returncode == 0, ping.stdout + ping.stderr
    back = here.hpcvm(
        "exec", "mvt", "--", BUSYBOX_IN_GUEST, "ping", "-c", "1", "-W", "10", "10.98.0.1"
    )
    assert back.returncode == 0, back.stdout + back.stderr
    assert not list(Path(machine.run_dir).glob("hv*")), "the device node hpcvm made was kept"

    down = here.hpcvm("down", "mvt")
    assert down.returncode == 0, down.stderr
    assert here.link(nic.ifname) is None, "down left the macvtap"


def test_a_crashed_qemu_s_macvtap_is_removed_with_its_stale_record(
    runtime: Path, wire: tuple[Netns, Netns]
) -> None:
    here, _ = wire
    proc = here.hpcvm("up", "--name", "mvc", *VM, "--network", f"macvtap={PARENT}")
    assert proc.returncode == 0, proc.stderr
    machine: Machine = state.load_machine("mvc")
    (nic,) = machine.boot.nics
    assert machine.pid is not None
    os.kill(machine.pid, signal.SIGKILL)  # QEMU dies; unlike a tap, a macvtap stays
    assert here.link(nic.ifname) is not None
    ps = here.hpcvm("ps")  # finds the VM stale and cleans it
    assert ps.returncode == 0, ps.stderr
    assert here.link(nic.ifname) is None, "the stale VM's macvtap was kept"


def test_refused_parents_leave_nothing(runtime: Path, wire: tuple[Netns, Netns]) -> None:
    here, _ = wire
    _ip("-n", here.name, "link", "add", "mvbr0", "type", "bridge")
    _ip("-n", here.name, "link", "add", "mvq0", "type", "veth", "peer", "name", "mvq1")
    _ip("-n", here.name, "link", "set", "mvq0", "master", "mvbr0")
    try:
        for network, message in [
            ("macvtap=mvbr0", "is a bridge, not a NIC"),
            ("macvtap=mvq0", "is a port of mvbr0"),
            ("macvtap=nosuch0", "no interface 'nosuch0'"),
        ]:
            proc = here.hpcvm("up", "--name", "mvbad", *VM, "--network", network)
            assert proc.returncode == 2, proc.stderr
            assert message in one_line_error(proc)
            assert _macvtaps(here) == []
    finally:
        _ip("-n", here.name, "link", "del", "mvbr0")
        _ip("-n", here.name, "link", "del", "mvq0")
