"""``verify`` of what the built-in guest sees of the host (runtime/shares.py).

Two checks, answered from inside the guest in one agent call:

- host paths outside the share list are absent: for each entry of the host's ``/``
  that no share covers (``/root``, ``/home``, ``/srv``, files at the top...), the entry
  itself, or for a directory the guest also has (its own empty ``/root``, ``/tmp``,
  ``/var``) or one that holds a share (``/work`` around ``/work/project``), one of its
  entries outside the shares; plus the ``/etc`` entries the share list hides. Every
  probe exists on the host when it is chosen, so "absent" in the guest means the guest
  cannot see it.
- every shared directory is there, at its guest path.

A disk image (no share table) has its own root: nothing to check here.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence

from hpcvm.bootspec import Share
from hpcvm.errors import HpcvmError
from hpcvm.runtime.model import Machine
from hpcvm.runtime.shares import ETC_SECRETS
from hpcvm.runtime.verify import Check, GuestExec

GUEST_TIMEOUT = 120.0
PSEUDO = ("/proc", "/sys", "/dev", "/run")  # the guest's own, never compared
GUEST_DIRS = ("/root", "/tmp", "/var")  # the guest has its own (empty) ones
FIRST = ("/root", "/home", "/var", "/srv")  # probed first: where secrets usually are
MAX_PROBES = 12
MAX_HIDDEN = 4
_SCRIPT = 'for p; do if [ -e "$p" ] || [ -L "$p" ]; then echo "present $p"; fi; done'


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


def hidden_probes(shares: Sequence[Share]) -> list[str]:
    """Guest paths of hidden entries (``/etc/shadow``...) that exist on the host."""
    out: list[str] = []
    for share in shares:
        named = sorted(share.hide, key=lambda rel: (not _named(rel), "/" in rel, rel))
        for rel in named[:MAX_HIDDEN]:
            if os.path.lexists(os.path.join(share.host_path, rel)):
                out.append(os.path.join(share.guest_path, rel))
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
    absent = absent_probes(boot.shares, [link.guest_path for link in boot.links])
    absent += hidden_probes(boot.shares)
    visible = [s.guest_path for s in boot.shares]
    try:
        present = _present(agent, [*absent, *visible])
    except HpcvmError as exc:
        failed = f"guest not readable: {exc.message}"
        return [_check("host paths outside the shares absent", absent, failed, False)]
    leaked = [p for p in absent if p in present]
    missing = [p for p in visible if p not in present]
    return [
        _check(
            "host paths outside the shares absent",
            absent,
            f"present: {', '.join(leaked)}" if leaked else "all absent",
            not leaked,
        ),
        _check(
            "shared directories visible",
            visible,
            f"missing: {', '.join(missing)}" if missing else "all there",
            not missing,
        ),
    ]


def _present(agent: GuestExec, paths: list[str]) -> set[str]:
    result = agent.exec(["/bin/sh", "-c", _SCRIPT, "sh", *paths], timeout=GUEST_TIMEOUT)
    if result.exit_code != 0:
        raise HpcvmError(f"the probe exited {result.exit_code}: {result.stderr.strip()}")
    return {line.removeprefix("present ") for line in result.stdout.splitlines()}


def _check(name: str, expected: Sequence[str], actual: str, ok: bool) -> Check:
    shown = ", ".join(expected) if expected else "(nothing to probe)"
    return Check(name=name, expected=shown, actual=actual, ok=ok)
