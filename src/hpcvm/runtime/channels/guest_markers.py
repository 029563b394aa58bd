"""The marker files the built-in guest's rc writes under /run/hpcvm (guest/scripts.py),
as the host reads them through the guest agent: that its NICs are set up, and which of
their addresses another host on the segment answered for.

Why a module of its own: these paths are a contract between the guest's boot script and
the host, and reading one is a request on the agent's channel, whoever waits for it
(``up``'s NIC check, runtime/vm/readiness.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcvm.runtime.channels.agent import GuestAgent

ADDRESS_IN_USE_FILE = "/run/hpcvm/address-in-use"  # written by the guest (guest/scripts.py)
NETWORK_DONE_FILE = "/run/hpcvm/network-done"  # the guest's rc, once its NICs are set up


def wait_network_done(agent: GuestAgent, limit: float = 30.0) -> None:
    """Wait until the guest's rc has set its NICs up (probe included, in the background
    of its boot); after ``limit`` s the NIC check says what is missing."""
    until = time.monotonic() + limit
    while time.monotonic() < until and guest_file(agent, NETWORK_DONE_FILE) is None:
        time.sleep(0.02)


def addresses_in_use(agent: GuestAgent) -> list[str]:
    """The addresses the guest found taken at boot (guest/scripts.py), if any."""
    text = guest_file(agent, ADDRESS_IN_USE_FILE)
    return [] if text is None else text.decode(errors="replace").split()


def guest_file(agent: GuestAgent, path: str) -> bytes | None:
    """A marker file the guest's rc writes, or None while it does not exist."""
    from hpcvm.runtime.channels.agent import AgentCommandError

    try:
        return agent.read_file(path)
    except AgentCommandError:
        return None
