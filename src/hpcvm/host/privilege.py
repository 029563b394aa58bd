"""Fixes worded for whoever can apply them: root, or the admin a user asks.

Many refusals name a fix only root can apply (start a daemon, write a file under /sys,
grant an ACL on a directory of root's). A user of a site's node who is told to run
`libvirtd -d` can do nothing with it; told to ask their admin, they know what to do.
So such a fix is given as it is to root, and as something to ask the admin for to
everyone else. In host/ (the first stage): who this process is on the host is a fact
of the host, and every later stage words such fixes.
"""

from __future__ import annotations

import os


def for_admin(fix: str) -> str:
    """``fix`` (an imperative, "run `libvirtd -d`") for root as it is; for a user who is
    not root, "ask your admin to " that."""
    return fix if os.geteuid() == 0 else f"ask your admin to {fix}"
