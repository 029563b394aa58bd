"""Whether anyone on this node's segment answers for an address, asked from the host.

A new guest probes its address itself before using it (RFC 5227, in the guest). A
restored guest cannot: it already holds its address in its saved memory and uses it
the moment it runs. So its node asks first, as an unprivileged process may: where the
address is on a segment this host is on (the kernel's route to it has no gateway), a
UDP datagram to its discard port makes the kernel resolve it (ARP) and a live host
answer it (ICMP port unreachable). Someone answers when the neighbour table (``ip
neigh``) holds an entry confirmed since the datagram went, or the datagram was
refused. An entry the table kept from earlier is no answer, whether ``STALE`` or still
``REACHABLE``: the kernel keeps a neighbour reachable for up to 45 s after the last
confirmation, so the VM of a job cancelled a moment ago would refuse its own restore
(found by the fault suite: a restore right after a cancelled job on the same nodes).
Where the entry is old and the host drops the datagram silently the address passes (a
missed conflict rather than a refused restore). Where the host has no address on that
segment there is nobody to ask from the host; the address claim on the node
(tasks/addresses.py) still holds.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import subprocess
import time
from typing import Any

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.net.network import ADDRESS_IN_USE

PROBE_WAIT = 1.0  # seconds for an answer (ARP's own retry is 1 s)


def on_link(ip: ipaddress.IPv4Address) -> bool:
    """Whether this host reaches ``ip`` directly (a route without a gateway)."""
    done = subprocess.run(
        ["ip", "-j", "route", "get", str(ip)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return False
    with contextlib.suppress(ValueError, IndexError, TypeError):
        route = json.loads(done.stdout)[0]
        return "gateway" not in route and route.get("type", "unicast") == "unicast"
    return False


def _neighbours(ip: ipaddress.IPv4Address) -> list[dict[str, Any]]:
    """The neighbour table's entries for ``ip``, with their ages (``ip -s``: whole
    seconds since last used, confirmed, updated)."""
    done = subprocess.run(
        ["ip", "-s", "-j", "neigh", "show", "to", str(ip)],
        capture_output=True,
        text=True,
        check=False,
    )
    with contextlib.suppress(ValueError):
        entries = json.loads(done.stdout or "[]")
        if isinstance(entries, list):
            return [e for e in entries if isinstance(e, dict)]
    return []


def answering_mac(entries: list[dict[str, Any]], within: float) -> str | None:
    """The hardware address of a neighbour that has answered in the last ``within``
    seconds (``REACHABLE``, confirmed since); an entry confirmed earlier is no answer."""
    for entry in entries:
        fresh = int(entry.get("confirmed", within + 1)) <= within
        if "REACHABLE" in entry.get("state", ()) and entry.get("lladdr") and fresh:
            return str(entry["lladdr"])
    return None


def known_mac(entries: list[dict[str, Any]]) -> str:
    """Whatever hardware address the entries hold, for a message."""
    return next((str(e["lladdr"]) for e in entries if e.get("lladdr")), "a host")


def _refused(probe: socket.socket) -> bool:
    """Whether the probe's datagram was refused (ICMP port unreachable: a live host)."""
    try:
        probe.recv(1)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return True  # something answered on the discard port itself


def check_free(address: ipaddress.IPv4Interface, vm: str) -> None:
    """RuntimeFailure (cause ``address-in-use``) when someone on the segment answers
    for ``address``; nothing when nobody does or this host cannot ask (module doc)."""
    ip = address.ip
    if not on_link(ip):
        return
    sent = time.monotonic()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.setblocking(False)
        with contextlib.suppress(OSError):
            probe.connect((str(ip), 9))  # discard: the ARP request and the refusal matter
            probe.send(b"")
        while time.monotonic() < sent + PROBE_WAIT:
            entries = _neighbours(ip)
            mac = answering_mac(entries, time.monotonic() - sent)
            if mac is None and _refused(probe):
                mac = known_mac(entries)
            if mac is not None:
                raise RuntimeFailure(
                    f"address {ip} of the saved VM {vm} is in use on the segment ({mac} "
                    "answers for it): is the job it was saved from still running? take it "
                    "down first",
                    cause=ADDRESS_IN_USE,
                )
            time.sleep(0.05)
