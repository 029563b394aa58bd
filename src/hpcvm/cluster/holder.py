"""The holder step's launcher on the batch node: runs its ``srun``, and when the step
has ended, however it ended (``cluster down``, ``scancel``, the job's end, a node's
failure), removes the cluster's state directory there.

When ``cluster down`` (or a failing ``up``) ends the step, that command removes the
directory itself once it has read the nodes' last events. Without the holder a job
ended by ``scancel`` would leave that directory behind: the batch
script is killed before its ``cluster down`` can run, and nothing else on the batch node
knows the step is over.

    python -m hpcvm.cluster.holder STATE_DIR SRUN_ARGV...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

TAKING_DOWN = "taking-down"  # made by control.py before it ends the step


def main(argv: list[str]) -> int:
    state_dir, *srun = argv
    # srun forwards SIGTERM to the tasks, which stop their VMs: pass ours on, and wait.
    proc = subprocess.Popen(srun, stdin=subprocess.DEVNULL)

    def _forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _forward)
    code = proc.wait()
    if (Path(state_dir) / TAKING_DOWN).exists():
        return code  # `cluster down` (or a failed `up`) reads the events, then removes it
    shutil.rmtree(state_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        Path(state_dir).parent.rmdir()
    return code


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main(sys.argv[1:]))
