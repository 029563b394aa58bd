"""A restore's address probe (cluster/tasks/address_probe.py) on a real segment: two network
namespaces joined by a veth pair, the kernel's own ARP and ICMP.

The probe must refuse an address a live host holds, and must not refuse one whose host
has just gone while the kernel still lists it as REACHABLE (it keeps a neighbour
reachable for up to 45 s after the last confirmation): the fault suite found a restore
refused so right after the job holding the address was cancelled. Oracle for the second
case: ``ip neigh`` itself shows the entry REACHABLE when the probe runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.integration

HOST, PEER = "hpcvm-probe-a", "hpcvm-probe-b"
HOST_IP, PEER_IP = "10.98.7.1", "10.98.7.2"
PROBE = "import ipaddress, sys; from hpcvm.cluster.tasks.address_probe import check_free; " \
        "check_free(ipaddress.IPv4Interface(sys.argv[1]), 'vm-under-test')"  # fmt: skip


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def segment() -> Iterator[None]:
    """HOST and PEER namespaces on one link, PEER holding PEER_IP; removed afterwards."""
    if subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() != "0":
        pytest.skip("network namespaces need root")
    for ns in (HOST, PEER):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    try:
        _ip("netns", "add", HOST)
        _ip("netns", "add", PEER)
        _ip("-n", HOST, "link", "add", "a0", "type", "veth", "peer", "name", "b0", "netns", PEER)
        _ip("-n", HOST, "addr", "add", f"{HOST_IP}/24", "dev", "a0")
        _ip("-n", PEER, "addr", "add", f"{PEER_IP}/24", "dev", "b0")
        _ip("-n", HOST, "link", "set", "a0", "up")
        _ip("-n", PEER, "link", "set", "b0", "up")
        yield
    finally:
        for ns in (HOST, PEER):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def _probe() -> subprocess.CompletedProcess[str]:
    """The probe as a node's task runs it, from HOST's namespace."""
    argv = ["ip", "netns", "exec", HOST, sys.executable, "-c", PROBE, f"{PEER_IP}/24"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _states() -> list[str]:
    done = subprocess.run(["ip", "-n", HOST, "-j", "neigh", "show", "to", PEER_IP],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return [s for entry in json.loads(done.stdout or "[]") for s in entry.get("state", [])]


def test_a_live_holder_is_found_and_a_gone_one_is_not(segment: None) -> None:
    live = _probe()
    assert live.returncode != 0, live
    assert f"address {PEER_IP} of the saved VM vm-under-test is in use" in live.stderr
    _ip("-n", PEER, "addr", "del", f"{PEER_IP}/24", "dev", "b0")  # its holder goes
    time.sleep(1.5)  # the entry's last confirmation now older than the probe's wait
    assert "REACHABLE" in _states(), _states()  # what the kernel still says
    gone = _probe()
    assert gone.returncode == 0, gone.stderr
