"""Processes by pid, read from /proc: whether one runs, and when it started (what
tells it from a later process that got its pid). One module for the runtime, the
cluster and bench, free of pydantic, so that `hpcvm exec` can ask whether QEMU runs
without loading the models."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from hpcvm.errors import RuntimeFailure


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3 on), None when the
    process is gone or hidden from this user (hidepid)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def reap_if_child(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our exited child, so it is not a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int, *, reap: bool = False) -> bool:
    """True while ``pid`` exists and is not a zombie (an exited process nobody has
    reaped yet: it runs nothing). ``reap`` first collects it if it is our own exited
    child: for a child no ``Popen`` waits on (QEMU once its starter returned), never for
    one whose exit status a ``Popen`` is still to read. A process /proc hides from this
    user (hidepid: another user's, such as the root parent of a ``sudo -u``) exists as
    long as the kernel says so to a signal 0; whether it is a zombie cannot be known."""
    if reap:
        reap_if_child(pid)
    fields = proc_stat(pid)
    if fields is not None:
        return fields[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's, hidden from /proc
    return Path(f"/proc/{pid}").exists()  # ours after all: gone between the two reads


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeFailure("cannot read the boot time from /proc/stat")


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of /proc/PID/stat), None
    when it is gone: with the pid it names one process, even once the pid is reused."""
    fields = proc_stat(pid)
    return None if fields is None else int(fields[19])  # fields[] starts at field 3


def process_start_time(pid: int) -> float | None:
    """Wall-clock start time of ``pid`` (1 s precision), None when it is gone."""
    ticks = process_start_ticks(pid)
    if ticks is None:
        return None
    return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")
