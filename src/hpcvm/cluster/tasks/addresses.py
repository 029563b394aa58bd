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
node take different slots: a slot is claimed by a file ``IP.RANDOM`` in a directory
every user on the node may write (``$HPCVM_ADDRESS_CLAIMS``, default
``/dev/shm/hpcvm-addresses``, root's and mode 1777, made by the node install: sticky,
so nobody removes or replaces another user's claim). The file holds the claiming
process's pid and start time, and counts only while that process lives and belongs to
the file's owner: a claim dies with its holder, and a file naming pid 1 or another
user's process, a symbolic link, a FIFO or anything not a regular file holds nothing
(never followed, never waited on). A claimer publishes its file, then looks for any
other live claim of the address and withdraws if it finds one, so two never both hold
it. A claims directory another user owns (its owner could remove anyone's claims) or
that others may write without the sticky bit is not used (root's hpcvm makes a sticky
one a user made root's and 1777, as the install would have). And before a guest uses its
address it asks the segment whether anyone answers for it (duplicate address detection,
in the guest), so an address taken outside hpcvm's knowledge is refused too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import stat
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from hpcvm.errors import UsageError
from hpcvm.procs import process_start_ticks

AUTO = "auto"
DEFAULT_CONFIG = "/etc/hpcvm/site.toml"
DEFAULT_CLAIMS = "/dev/shm/hpcvm-addresses"
DEFAULT_SLOTS = 4
CLAIM_TRIES = 5  # claimers of one address at the same moment (claim)
CLAIM_BACKOFF = 0.02  # seconds, at most, between two tries


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
    """Claim ``address`` on this node for this process; None when a live claim of
    another process holds it (module doc). Without a claims directory this user may
    write and trust, every address is "claimed" (duplicate address detection still
    guards)."""
    directory = directory or claims_dir()
    ip = str(address.ip)
    try:
        _ensure_dir(directory)
    except OSError:
        return Claim(address, None)
    for _ in range(CLAIM_TRIES):
        try:
            mine = _publish(directory, ip)
        except OSError:
            return Claim(address, None)
        if not _held_by_another(directory, ip, mine):
            return Claim(address, mine)
        mine.unlink()
        # Two claimers who published at once both see the other and withdraw: wait a
        # random moment and try again, unless a live claim is still there.
        time.sleep(random.uniform(0, CLAIM_BACKOFF))
        if _held_by_another(directory, ip, None):
            return None
    return None


def _held_by_another(directory: Path, ip: str, mine: Path | None) -> bool:
    return any(_holds(path) for path in _claim_files(directory, ip) if path != mine)


def _ensure_dir(directory: Path) -> None:
    """The claims directory, made if missing; OSError when it is not one this user may
    trust: root's or this user's, sticky wherever others may write, no symbolic link
    (paths.dir_problem). The owner of a directory may remove anything in it, so one
    another user made is not used: the admin makes it (docs/site.md), and root's hpcvm
    makes one a user made root's, the others' claims in it kept."""
    if not os.path.lexists(directory):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o1777, parents=True)
        if os.lstat(directory).st_uid == os.geteuid():
            directory.chmod(0o1777)  # whatever the umask: every user's jobs claim here
    elif os.geteuid() == 0 and _shared_dir_of_a_user(directory):
        os.chown(directory, 0, 0)  # what the node install makes (a user's: nobody trusts it)
        directory.chmod(0o1777)
    from hpcvm.runtime.hostside.paths import (
        dir_problem,  # here: it loads the models, and --help must not
    )

    problem = dir_problem(directory, owners="me or root", sticky_ok=True)
    if problem is not None:
        raise PermissionError(f"{directory} {problem.text}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(directory)


def _shared_dir_of_a_user(directory: Path) -> bool:
    """A sticky directory (not a link) that a user made: one root may make its own."""
    info = os.lstat(directory)
    return stat.S_ISDIR(info.st_mode) and info.st_uid != 0 and bool(info.st_mode & stat.S_ISVTX)


def _publish(directory: Path, ip: str) -> Path:
    """A new claim file of this process for ``ip`` (``IP.RANDOM``), complete before it
    appears (written under a hidden name, then linked: a link never replaces a file)."""
    fd, temporary = tempfile.mkstemp(prefix=".new-", dir=directory)
    try:
        os.write(fd, f"{os.getpid()} {_start_time(os.getpid())}\n".encode())
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    try:
        while True:
            path = directory / f"{ip}.{secrets.token_hex(6)}"
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
                return path
    finally:
        os.unlink(temporary)


def _claim_files(directory: Path, ip: str) -> list[Path]:
    """Every file that may claim ``ip``: ``IP.*``, and ``IP`` as older hpcvm wrote it."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / n for n in names if n == ip or n.startswith(f"{ip}.")]


def _holds(path: Path) -> bool:
    """Whether the claim file at ``path`` is a live claim: a regular file (never
    followed if a link, never waited on if a FIFO) naming a live process of the file's
    owner, started when the file says (so a reused pid does not count). Anything else
    holds nothing; this user's own dead claims are removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # a symbolic link (ELOOP), gone, or unreadable
    try:
        info = os.fstat(fd)
        data = os.read(fd, 256) if stat.S_ISREG(info.st_mode) else b""
    finally:
        os.close(fd)
    live = stat.S_ISREG(info.st_mode) and _holder_alive(data.decode(errors="replace"), info.st_uid)
    if not live and info.st_uid == os.geteuid() and stat.S_ISREG(info.st_mode):
        with contextlib.suppress(OSError):
            path.unlink()
    return live


def _holder_alive(text: str, owner: int) -> bool:
    """Whether ``text`` ("PID START", or "PID" as older hpcvm wrote it) names a live
    process whose effective user is ``owner`` and whose start time is START."""
    fields = text.split()
    try:
        pid = int(fields[0])
        start = int(fields[1]) if len(fields) > 1 else None
    except (ValueError, IndexError):
        return False  # empty or half-written: its writer died mid-write
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        started = _start_time(pid)
    except (OSError, ValueError, IndexError):
        return False  # gone, or hidden from this user (hidepid): it cannot be checked
    uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
    state = next((line.split()[1] for line in status.splitlines() if line.startswith("State:")), "")
    return (
        len(uids) > 1
        and int(uids[1]) == owner
        and state not in ("Z", "X")
        and (start is None or start == started)
    )


def _start_time(pid: int) -> int:
    """When ``pid`` started (procs.process_start_ticks); OSError when gone."""
    ticks = process_start_ticks(pid)
    if ticks is None:
        raise FileNotFoundError(f"/proc/{pid}/stat")
    return ticks
