"""Where the time of a start goes: wall-clock marks, written only when asked.

``hpcvm cluster up`` spans several processes on several nodes (the client, the holder,
the batch system's step, a task per node, QEMU, the guest agent): a profiler of one
process sees none of the others. With ``HPCVM_TIMELINE=FILE`` in the environment (the
batch system passes it on to every task) each process appends one line per mark,
``SECONDS PID WHAT``, with the wall clock (the nodes' clocks are the host's on the test
cluster; on real nodes they are as close as NTP keeps them), and its own start time
read from the kernel (``/proc/self/stat``), so the interpreter's start and imports are
counted too. Without the variable a mark costs one dictionary lookup.
benchmarks/cluster_up.py reads the file.
"""

from __future__ import annotations

import os
import time

ENV = "HPCVM_TIMELINE"


def mark(what: str) -> None:
    """Append ``what`` at the present time (module doc); never fails the caller."""
    path = os.environ.get(ENV)
    if not path:
        return
    _append(path, time.time(), what)


def mark_process_start(what: str) -> None:
    """Append ``what`` at this process's start, as the kernel recorded it (10 ms ticks)."""
    path = os.environ.get(ENV)
    if not path:
        return
    started = _process_start()
    if started is not None:
        _append(path, started, what)


def _append(path: str, seconds: float, what: str) -> None:
    line = f"{seconds:.3f} {os.getpid()} {what}\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        os.write(fd, line.encode())  # one write of one line: appends do not interleave
    finally:
        os.close(fd)


def _process_start() -> float | None:
    """This process's start in wall-clock seconds: its start tick since boot, carried
    over to the wall clock by the clock since boot (which starttime counts in)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # stat field 22: starttime
    except (OSError, IndexError, ValueError):
        return None
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
