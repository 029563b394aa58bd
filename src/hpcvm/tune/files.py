"""Reading and writing the kernel's tunable files (/proc/sys, /sys, /proc/irq).

A write is one ``write(2)`` on a fresh descriptor, so the kernel's answer (EINVAL for a
bad value, EIO for an IRQ it will not move, EACCES without root) comes back from that
call instead of being deferred to ``close`` by buffering.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from hpcvm.tune.errors import TuneError


class Refused(Exception):
    """The kernel refused this particular value: an IRQ it manages itself (EIO), or one
    the platform pins (EPERM from the write after the open succeeded, as for a virtio
    block queue under a paravirtual hypervisor)."""


_REFUSALS = (errno.EIO, errno.EPERM)


def read(path: Path | str) -> str | None:
    """The file's text exactly as the kernel gives it; None when it does not exist."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TuneError(f"cannot read {path}: {exc.strerror}") from exc


def write(path: Path | str, value: str, *, may_refuse: bool = False) -> None:
    """Write ``value`` in one call. With ``may_refuse``, EIO or EPERM from the write (the
    open already passed the permission check) is raised as Refused."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise TuneError(f"cannot open {path} for writing: {exc.strerror}{_hint(exc)}") from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        if may_refuse and exc.errno in _REFUSALS:
            raise Refused(str(path)) from exc
        raise TuneError(f"writing {value!r} to {path} failed: {exc.strerror}{_hint(exc)}") from exc
    finally:
        os.close(fd)


def _hint(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return " (run as root, on a host whose /proc/sys and /sys are writable)"
    return ""
