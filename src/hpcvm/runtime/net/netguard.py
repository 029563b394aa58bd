"""Anti-spoofing on every bridge tap: hpcvm-netguard (csrc/hpcvm-netguard.c), a narrow
helper an admin installs setuid root (scripts/install-node.sh; docs/site.md "What
separates users").

A user is root in their own guest, and a bridge alone checks nothing: a guest could send
from any MAC and claim any address on the segment (the node's, another user's VM's).
So right after a VM's tap exists and before its guest runs, hpcvm hands the helper the
tap (its descriptor for a user: holding it proves the tap is theirs; its name for root)
with the NIC's MAC and address, and the helper installs rules in the kernel's bridge
filter (nftables, table ``bridge hpcvm_netguard``) that let through only that MAC, ARP
and IPv4 from that address, and count, log and drop the rest. A tap nobody guarded
carries nothing, so a user who runs QEMU's bridge helper by hand gains nothing. The
rules go with the tap: every call of the helper collects those of taps that are gone,
and ``down`` calls it (``collect``).

With ``job-isolation on`` in the admin's config (off by default), the helper also filters
what reaches each tap: IPv4 and ARP from the VM ranges pass only from the tap's peers,
the other VMs of the same job (``--peer``; job_peers below), so one job's VMs reach
each other and the nodes and nothing of another job's. Naming peers is the caller's
own business: a lie opens only the caller's own VM.

A NIC without ``--address`` gets no IPv4 at all (ARP address probes only): hpcvm's
guests take their address from the kernel command line and need no DHCP, and a NIC
that could use any address is the hole this closes.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hpcvm.bootspec import Nic
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.host.privilege import for_admin

ENV = "HPCVM_NETGUARD"  # root's tests and development: the built helper
INSTALLED = Path("/usr/local/lib/hpcvm/hpcvm-netguard")
CONFIG = Path("/etc/hpcvm/netguard.conf")  # the admin's (root's, world-readable)
TABLE = ("bridge", "hpcvm_netguard")
TIMEOUT = 30.0
USAGE_EXIT = 2  # the helper's exit status for a refused request (csrc/hpcvm-netguard.c)
GRANT = (
    "an admin installs it once per node: scripts/install-node.sh --only netguard (it is "
    f"{INSTALLED}, setuid root through dpkg-statoverride; docs/site.md)"
)


def helper() -> Path:
    """The helper to run: ``$HPCVM_NETGUARD`` when set, else the installed one, else (for
    root only, who needs no setuid bit) the one ``make all`` built into the package."""
    override = os.environ.get(ENV)
    if override:
        return Path(override).absolute()
    if INSTALLED.exists() or os.geteuid() != 0:
        return INSTALLED
    from importlib import resources

    return Path(str(resources.files("hpcvm").joinpath("data", "hpcvm-netguard"))).absolute()


def check_grant(bridge: str) -> None:
    """Refuse before anything starts when this process cannot guard a tap in ``bridge``:
    no helper, or (for a user) one that is not setuid root."""
    path = helper()
    try:
        info = path.stat()
    except OSError:
        if os.geteuid() == 0:
            raise UsageError(
                f"--network bridge={bridge} needs hpcvm-netguard, the helper that keeps each "
                f"VM to its own MAC and address, and {path} is missing: build it with "
                "`make all` (packages libnftables-dev, libjansson-dev) or install it "
                "(scripts/install-node.sh --only netguard)"
            ) from None
        raise UsageError(
            f"--network bridge={bridge} as a user needs hpcvm-netguard, the helper that keeps "
            f"each VM to its own MAC and address, and {path} is missing: {GRANT}"
        ) from None
    if os.geteuid() != 0 and not (info.st_mode & stat.S_ISUID and info.st_uid == 0):
        raise UsageError(
            f"--network bridge={bridge} as a user needs hpcvm-netguard setuid root, and "
            f"{path} is not: {GRANT}"
        )


_peers: tuple[str, ...] = ()  # the job's VM addresses, while job_peers holds


@contextmanager
def job_peers(addresses: Iterable[str]) -> Iterator[None]:
    """Guard the taps made meanwhile (in this process: a node's VM of a cluster job) with
    ``addresses`` as their peers: the job's VMs, on this node and others. A process
    variable, not an argument down the whole ``up``: only the job knows them, and the
    backends' threads see it too."""
    global _peers
    before, _peers = _peers, tuple(dict.fromkeys(a.split("/")[0] for a in addresses))
    try:
        yield
    finally:
        _peers = before


def isolation_on(config: Path | None = None) -> bool:
    """Whether the admin's config turns job isolation on (``job-isolation on``; the
    helper reads the same file). False when there is none or this user cannot read it
    (the helper judges anyway)."""
    try:
        lines = (config or CONFIG).read_text().splitlines()
    except OSError:
        return False
    on = False
    for line in lines:  # the last such line counts, as in the helper
        words = line.split("#")[0].split()
        if len(words) == 2 and words[0] == "job-isolation":
            on = words[1] == "on"
    return on


def guard_argv(nic: Nic, *, fd: int | None = None) -> list[str]:
    """The helper's arguments for ``nic``'s tap (with the peers job_peers set, where the
    site's config turns job isolation on: a node's helper from before isolation existed
    then still guards the taps of a site that does not use it)."""
    argv = ["guard", "--mac", nic.mac]
    if nic.address:
        argv += ["--ip", nic.address.split("/")[0]]
    if _peers and isolation_on():
        argv += [word for peer in _peers for word in ("--peer", peer)]
    if fd is None:
        return [*argv, "--ifname", nic.ifname]
    return [*argv, "--fd", str(fd)]


def guard(nic: Nic, *, fd: int | None = None) -> None:
    """Install ``nic``'s rules on its tap: by descriptor (a user's tap from the bridge
    helper) or, for root, by the name QEMU gave it. UsageError for what the helper
    refuses (a MAC or address that is the node's or another VM's, a range the admin does
    not allow), RuntimeFailure when it fails; either way nothing runs unguarded."""
    _run(
        guard_argv(nic, fd=fd),
        pass_fds=() if fd is None else (fd,),
        what=f"guard the tap of NIC {nic.mac}",
    )


def collect() -> None:
    """Remove the rules of taps that are gone (a VM taken down or crashed). Best effort:
    a failure here leaves rules on no live tap, and the next call collects them."""
    try:
        _run(["gc"], pass_fds=(), what="collect the rules of gone taps")
    except (UsageError, RuntimeFailure):
        return


def _run(argv: list[str], *, pass_fds: tuple[int, ...], what: str) -> None:
    path = helper()
    try:
        done = subprocess.run(
            [str(path), *argv], pass_fds=pass_fds, capture_output=True, text=True,
            timeout=TIMEOUT, check=False, env={},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeFailure(f"hpcvm-netguard ({path}) failed to {what}: {exc}") from None
    if done.returncode == 0:
        return
    said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    said = said.removeprefix("hpcvm-netguard: ")
    if done.returncode == USAGE_EXIT:
        raise UsageError(f"hpcvm-netguard refused to {what}: {said}")
    raise RuntimeFailure(
        f"hpcvm-netguard failed to {what}: {said}; " + for_admin(f"check {path}") + f" ({GRANT})"
    )
