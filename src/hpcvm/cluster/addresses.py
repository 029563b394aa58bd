"""``--address auto``: a guest address for each node's VM that no other job can take.

An address must be unique on the whole segment, across jobs, users and nodes, without a
DHCP server and without a service that hands them out. So it is derived from something
already unique, the node's own address on its bridge, inside a pool the site's admin
sets aside for VMs (``/etc/hpcvm/site.toml``; ``$HPCVM_SITE_CONFIG`` names another)::

    [addresses]
    pool = "10.77.0.128/25"   # VM addresses on the nodes' segment, none a node's own
    slots = 4                 # VMs one node may run at once (jobs sharing the node)

The node whose address is host number ``h`` of its bridge's subnet owns the pool's
addresses ``h*slots`` to ``h*slots + slots - 1``: nodes never share one. Jobs sharing a
node take different slots: a slot is claimed by a file in a directory every user on the
node may write (``$HPCVM_ADDRESS_CLAIMS``, default ``/dev/shm/hpcvm-addresses``, made
mode 1777 by the node install), created exclusively and holding the claiming process's
pid, so a claim dies with its holder. And before a guest uses its address it asks the
segment whether anyone answers for it (duplicate address detection, in the guest), so
an address taken outside hpcvm's knowledge is refused too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from hpcvm.errors import UsageError

AUTO = "auto"
DEFAULT_CONFIG = "/etc/hpcvm/site.toml"
DEFAULT_CLAIMS = "/dev/shm/hpcvm-addresses"
DEFAULT_SLOTS = 4


def site_config() -> Path:
    return Path(os.environ.get("HPCVM_SITE_CONFIG", DEFAULT_CONFIG))


def claims_dir() -> Path:
    return Path(os.environ.get("HPCVM_ADDRESS_CLAIMS", DEFAULT_CLAIMS))


@dataclass(frozen=True)
class AddressPool:
    """The site's VM addresses and how many VMs a node may run at once."""

    network: ipaddress.IPv4Network
    slots: int


def site_pool(path: Path | None = None) -> AddressPool:
    """The pool from the site configuration; UsageError naming the admin's fix."""
    path = path or site_config()
    fix = (
        f'an admin sets [addresses] pool = "A.B.C.D/N" (and slots) in {path} '
        "(docs/site.md), or give --address IP/PREFIX"
    )
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--address auto needs the site's VM address pool: {fix}") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path} cannot be read ({exc}): {fix}") from None
    section = data.get("addresses")
    if not isinstance(section, dict) or "pool" not in section:
        raise UsageError(f"{path} has no [addresses] pool: {fix}")
    try:
        network = ipaddress.IPv4Network(str(section["pool"]), strict=True)
        slots = int(section.get("slots", DEFAULT_SLOTS))
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{path}: [addresses] is malformed ({exc}): {fix}") from None
    if slots < 1:
        raise UsageError(f"{path}: [addresses] slots must be 1 or more: {fix}")
    return AddressPool(network, slots)


def candidates(pool: AddressPool, node: ipaddress.IPv4Interface) -> list[ipaddress.IPv4Interface]:
    """The addresses the node with address ``node`` may give its VMs, by slot (pure).

    Their prefix is the node's subnet's when the pool lies inside it (the VMs share the
    nodes' segment and subnet), else the pool's own."""
    host = int(node.ip) - int(node.network.network_address)
    first = host * pool.slots
    usable = pool.network.num_addresses - (2 if pool.network.prefixlen < 31 else 0)
    offset = 1 if pool.network.prefixlen < 31 else 0
    if first + pool.slots > usable:
        raise UsageError(
            f"node {node.ip} (host {host} of {node.network}) has no slots in the VM address "
            f"pool {pool.network} ({pool.slots} per node): the admin widens the pool or "
            f"lowers slots in {site_config()}"
        )
    prefix = (
        node.network.prefixlen if pool.network.subnet_of(node.network) else pool.network.prefixlen
    )
    start = int(pool.network.network_address) + offset + first
    return [
        ipaddress.IPv4Interface(f"{ipaddress.IPv4Address(start + s)}/{prefix}")
        for s in range(pool.slots)
    ]


@dataclass
class Claim:
    """This process's claim on one address on this node; released explicitly or with
    the process."""

    address: ipaddress.IPv4Interface
    path: Path | None

    def release(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.path = None


def claim(address: ipaddress.IPv4Interface, directory: Path | None = None) -> Claim | None:
    """Claim ``address`` on this node for this process; None when a live process holds
    it. A claim whose holder is gone is taken over. Without a claims directory this
    user may write, every address is "claimed" (duplicate address detection still
    guards)."""
    directory = directory or claims_dir()
    try:
        _ensure_dir(directory)
    except OSError:
        return Claim(address, None)
    path = directory / str(address.ip)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _holder_alive(path):
                return None
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        except OSError:
            return Claim(address, None)
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        return Claim(address, path)
    return None


def _ensure_dir(directory: Path) -> None:
    if not directory.is_dir():
        directory.mkdir(mode=0o1777, parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):
            directory.chmod(0o1777)  # every user's jobs claim here (sticky: own files only)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(directory)


def _holder_alive(path: Path) -> bool:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False  # unreadable or half-written: its writer died mid-write
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
