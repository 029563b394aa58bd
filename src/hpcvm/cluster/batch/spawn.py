"""How hpcvm starts a process of its own (a node task, the holder, a reaper, a local
step): one command line for every role, the same interpreter and package as the
process that starts it (a cluster shares its software installation). The roles are
in internal.py, which this module does not import, so that a role may start another."""

from __future__ import annotations

import sys

INTERNAL_MODULE = "hpcvm.cluster.internal"


def internal_argv(role: str) -> list[str]:
    """The command line that starts ``role``, without its arguments."""
    return [sys.executable, "-m", INTERNAL_MODULE, role]
