"""``verify`` of what the built-in guest sees of the host (runtime/hostside/shares.py).

Two checks, answered from inside the guest in one agent call:

- host paths outside the share list are absent: for each entry of the host's ``/``
  that no share covers (``/root``, ``/home``, ``/srv``, files at the top...), the entry
  itself, or for a directory the guest also has (its own empty ``/root``, ``/tmp``,
  ``/var``) or one that holds a share (``/work`` around ``/work/project``), one of its
  entries outside the shares; plus the ``/etc`` entries the share list hides. Every
  probe exists on the host when it is chosen, so "absent" in the guest means the guest
  cannot see it. A hidden file the guest has with other bytes than the host's is the
  guest's own (cluster guests write an ``/etc/shadow`` of their own for sshd), not a
  leak: the guest hashes what it has, the host what it hides.
- every shared directory is there, at its guest path.

A disk image (no share table) has its own root: nothing to check here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Sequence

from hpcvm.bootspec import Share
from hpcvm.errors import HpcvmError
from hpcvm.runtime.hostside.shares import ETC_SECRETS
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.verify.checks import Check, GuestExec

GUEST_TIMEOUT = 120.0
PSEUDO = ("/proc", "/sys", "/dev", "/run")  # the guest's own, never compared
GUEST_DIRS = ("/root", "/tmp", "/var")  # the guest has its own (empty) ones
FIRST = ("/root", "/home", "/var", "/srv")  # probed first: where secrets usually are
MAX_PROBES = 12
MAX_HIDDEN = 4
# "present HASH PATH" per path the guest has: HASH is a regular file's SHA-256, or "-"
_SCRIPT = (
    'for p; do if [ -f "$p" ] && [ ! -L "$p" ]; then h=$(sha256sum < "$p" | cut -c1-64); '
    'echo "present ${h:--} $p"; elif [ -e "$p" ] || [ -L "$p" ]; then echo "present - $p"; '
    "fi; done"
)


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def absent_probes(shares: Sequence[Share], skip: Sequence[str] = (), root: str = "/") -> list[str]:
    """Host paths (existing now) that no share shows the guest, at most ``MAX_PROBES``.

    ``skip`` are further guest paths to leave alone (the guest's root symlinks)."""
    guest_paths = [s.guest_path for s in shares]
    keep_out = [*(os.path.join(root, p.lstrip("/")) for p in PSEUDO), *skip]
    own = {os.path.join(root, p.lstrip("/")) for p in GUEST_DIRS}
    first = [os.path.join(root, p.lstrip("/")) for p in FIRST]

    def covered(path: str) -> bool:
        return any(_within(path, g) for g in guest_paths) or any(_within(path, k) for k in keep_out)

    def holds_share(path: str) -> bool:
        return any(_within(g, path) and g != path for g in guest_paths)

    probes: list[str] = []
    entries = _entries(root)
    for path in sorted(entries, key=lambda p: (p not in first, p)):
        if covered(path):
            continue
        if path in own or holds_share(path):
            inner = next((c for c in _entries(path) if not covered(c) and not holds_share(c)), None)
            if inner is not None:
                probes.append(inner)
        else:
            probes.append(path)
        if len(probes) >= MAX_PROBES:
            break
    return probes


def _entries(directory: str) -> list[str]:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if "\n" not in n]


def hidden_probes(shares: Sequence[Share]) -> dict[str, str]:
    """Hidden entries (``/etc/shadow``...) that exist on the host: guest path -> host
    path."""
    out: dict[str, str] = {}
    for share in shares:
        named = sorted(share.hide, key=lambda rel: (not _named(rel), "/" in rel, rel))
        for rel in named[:MAX_HIDDEN]:
            host = os.path.join(share.host_path, rel)
            if os.path.lexists(host):
                out[os.path.join(share.guest_path, rel)] = host
    return out


def _host_hash(path: str) -> str | None:
    """A regular file's SHA-256 as the host has it (None: not a file, or unreadable)."""
    try:
        if not os.path.isfile(path) or os.path.islink(path):
            return None
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def leaked(present: dict[str, str], probes: Sequence[str], hidden: dict[str, str]) -> list[str]:
    """Probed paths the guest sees that are the host's: present, and for a hidden file
    not a file of the guest's own (a guest may write its own ``/etc/shadow`` into its
    overlay, as cluster guests do for sshd: different bytes, no leak)."""
    out = []
    for path in probes:
        if path not in present:
            continue
        host = _host_hash(hidden[path]) if path in hidden else None
        if host is not None and present[path] not in ("-", host):
            continue
        out.append(path)
    return out


def _named(rel: str) -> bool:
    """One of the secrets hidden by name (shadow, sudoers...): probed first."""
    return any(fnmatch.fnmatchcase(rel, pattern) for pattern in ETC_SECRETS)


def check_shares(machine: Machine, agent: GuestExec) -> list[Check]:
    """The two checks (module doc) for ``machine``; none for a guest without a share
    table."""
    boot = machine.boot
    if not boot.share_table:
        return []
    hidden = hidden_probes(boot.shares)
    absent = absent_probes(boot.shares, [link.guest_path for link in boot.links]) + list(hidden)
    visible = [s.guest_path for s in boot.shares]
    try:
        present = _present(agent, [*absent, *visible])
    except HpcvmError as exc:
        failed = f"guest not readable: {exc.message}"
        return [_check("host paths outside the shares absent", absent, failed, False)]
    seen = leaked(present, absent, hidden)
    missing = [p for p in visible if p not in present]
    return [
        _check(
            "host paths outside the shares absent",
            absent,
            f"present: {', '.join(seen)}" if seen else "all absent",
            not seen,
        ),
        _check(
            "shared directories visible",
            visible,
            f"missing: {', '.join(missing)}" if missing else "all there",
            not missing,
        ),
    ]


def _present(agent: GuestExec, paths: list[str]) -> dict[str, str]:
    """The paths the guest has, each with its file's SHA-256 or "-"."""
    result = agent.exec(["/bin/sh", "-c", _SCRIPT, "sh", *paths], timeout=GUEST_TIMEOUT)
    if result.exit_code != 0:
        raise HpcvmError(f"the probe exited {result.exit_code}: {result.stderr.strip()}")
    out = {}
    for line in result.stdout.splitlines():
        _, _, rest = line.partition("present ")
        digest, _, path = rest.partition(" ")
        out[path] = digest
    return out


def _check(name: str, expected: Sequence[str], actual: str, ok: bool) -> Check:
    shown = ", ".join(expected) if expected else "(nothing to probe)"
    return Check(name=name, expected=shown, actual=actual, ok=ok)
