"""The last resort of a node's task: takes its VM down if the task dies without doing
so itself.

A task stops its VM when Slurm sends SIGTERM. But Slurm follows with SIGKILL after
``KillWait`` seconds, and an OOM kill or a crash gives no warning at all; QEMU runs in
a session of its own (so that the terminal's Ctrl-C reaches hpcvm, which then stops it
in order), so where Slurm tracks processes by process group (``proctrack/pgid``) a
QEMU could outlive its job. The task therefore starts this reaper first, in a session
of its own, holding the read end of a pipe whose write end only the task holds: when
the task ends, however it ends, the kernel closes that end, the read here returns, and
the reaper takes the VM down if it is still there (a task that stopped its VM itself
leaves nothing to do).

Started as ``python -m hpcvm.cluster.internal reaper VM_NAME`` (stdin: the pipe).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from hpcvm.cluster.batch.spawn import internal_argv
from hpcvm.errors import HpcvmError

STOP_TIMEOUT = 2.0


def start(vm_name: str) -> int:
    """Start the reaper for ``vm_name``; return the pipe's write end, which the caller
    keeps open (never writes) for as long as it holds the VM."""
    read_end, write_end = os.pipe()
    try:
        subprocess.Popen(
            [*internal_argv("reaper"), vm_name],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        os.close(read_end)
    return write_end


def main(argv: list[str]) -> int:
    [vm_name] = argv
    with contextlib.suppress(OSError):
        sys.stdin.buffer.read()  # returns at EOF: the task has ended
    from hpcvm.plugins import load_plugins
    from hpcvm.runtime.vm import stopping

    try:
        load_plugins()  # late (internal.LATE_PLUGINS): a plugin backend's VM needs them
    except HpcvmError as exc:  # still stop what the built-in backends can
        sys.stderr.write(f"hpcvm: reaper: {exc}\n")
    with contextlib.suppress(HpcvmError):
        stopping.down(vm_name, timeout=STOP_TIMEOUT)
    return 0
