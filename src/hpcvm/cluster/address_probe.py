"""Whether anyone on this node's segment answers for an address, asked from the host.

A new guest probes its address itself before using it (RFC 5227, in the guest). A
restored guest cannot: it already holds its address in its saved memory and uses it
the moment it runs. So its node asks first, as an unprivileged process may: where the
address is on a segment this host is on (the kernel's route to it has no gateway), a
UDP datagram to it makes the kernel resolve it (ARP), and the neighbour table
(``ip neigh``) then says whether someone answered. An entry the table kept from
earlier (stale) is not taken as an answer: the kernel would first use it for 5 s
before asking again, so such an address passes (a missed conflict rather than a
refused restore). Where the host has no address
on that segment there is nobody to ask from the host; the address claim on the node
(addresses.py) still holds.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import subprocess
import time

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.network import ADDRESS_IN_USE

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


def answering_mac(ip: ipaddress.IPv4Address) -> str | None:
    """The hardware address of a neighbour that has just answered for ``ip``
    (``REACHABLE``); an entry left from earlier (``STALE``) is not an answer."""
    done = subprocess.run(
        ["ip", "-j", "neigh", "show", "to", str(ip)], capture_output=True, text=True, check=False
    )
    with contextlib.suppress(ValueError, TypeError):
        for entry in json.loads(done.stdout or "[]"):
            if "REACHABLE" in entry.get("state", ()) and entry.get("lladdr"):
                return str(entry["lladdr"])
    return None


def check_free(address: ipaddress.IPv4Interface, vm: str) -> None:
    """RuntimeFailure (cause ``address-in-use``) when someone on the segment answers
    for ``address``; nothing when nobody does or this host cannot ask (module doc)."""
    ip = address.ip
    if not on_link(ip):
        return
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe, contextlib.suppress(OSError):
        probe.sendto(b"", (str(ip), 9))  # discard: only the ARP request matters
    until = time.monotonic() + PROBE_WAIT
    while time.monotonic() < until:
        mac = answering_mac(ip)
        if mac is not None:
            raise RuntimeFailure(
                f"address {ip} of the saved VM {vm} is in use on the segment ({mac} answers "
                "for it): is the job it was saved from still running? take it down first",
                cause=ADDRESS_IN_USE,
            )
        time.sleep(0.05)
