"""``verify`` of a VM's NICs (runtime/net/network.py) from inside: the guest's own ``ip -j
addr`` says whether an interface with each planned MAC is up with the planned MTU and
address. Also run by ``up`` for a guest that configures its NICs itself."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hpcvm.bootspec import Nic
from hpcvm.errors import HpcvmError
from hpcvm.runtime.verify.checks import Check, GuestExec
from hpcvm.runtime.verify.checks import check as _check

GUEST_TIMEOUT = 120.0  # one guest-exec under TCG on a busy 2-core host

GUEST_IP_ARGV = ("ip", "-j", "addr", "show")  # the host's iproute2, run in the guest


def nic_checks(nics: Sequence[Nic], ip_json: str) -> list[Check]:
    """For each planned NIC: an interface with its MAC is there, with its MTU, up, and
    with its address (when one was planned). Pure: ``ip_json`` is the guest's
    ``ip -j addr show``, the guest kernel's own view (netlink), not hpcvm's."""
    try:
        links: list[dict[str, Any]] = json.loads(ip_json or "[]")
    except json.JSONDecodeError as exc:
        return [_check("guest NICs", "ip -j addr output", "unreadable", False, str(exc))]
    by_mac = {str(link.get("address", "")).lower(): link for link in links}
    checks: list[Check] = []
    for nic in nics:
        link = by_mac.get(nic.mac)
        if link is None:
            checks.append(_check(f"NIC {nic.mac}", "present", "no interface", False))
            continue
        name = str(link.get("ifname", "?"))
        mtu = link.get("mtu")
        checks.append(_check(f"NIC {nic.mac} MTU", nic.mtu, mtu, mtu == nic.mtu, name))
        up = "UP" in link.get("flags", [])
        checks.append(_check(f"NIC {nic.mac} up", "UP", "UP" if up else "down", up, name))
        if nic.address is not None:
            have = [
                f"{a['local']}/{a['prefixlen']}"
                for a in link.get("addr_info", [])
                if a.get("family") == "inet"
            ]
            ok = nic.address in have
            got = ", ".join(have) or "none"
            checks.append(_check(f"NIC {nic.mac} address", nic.address, got, ok, name))
    return checks


def check_nics(nics: Sequence[Nic], agent: GuestExec) -> list[Check]:
    """``nic_checks`` on what the guest reports (one agent call; none without NICs)."""
    if not nics:
        return []
    try:
        result = agent.exec(list(GUEST_IP_ARGV), timeout=GUEST_TIMEOUT)
    except HpcvmError as exc:
        return [_check("guest NICs", "ip -j addr in the guest", "failed", False, exc.message)]
    if result.exit_code != 0:
        why = result.stderr.strip().splitlines()
        detail = why[-1] if why else f"exit {result.exit_code}"
        return [_check("guest NICs", "ip -j addr in the guest", "failed", False, detail)]
    return nic_checks(nics, result.stdout)
