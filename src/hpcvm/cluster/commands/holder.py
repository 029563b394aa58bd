"""The holder step's launcher on the batch node: runs the step's command line (the
batch system's, batch/base.py), and when the step has ended, however it ended (``cluster
down``, the job's end, a node's failure), removes the cluster's state directory there.

When ``cluster down`` (or a failing ``up``) ends the step, that command removes the
directory itself once it has read the nodes' last events (job/state.py ``taking-down``).
Without the holder a job ended by the batch system (``scancel``) would leave that
directory behind: the batch script is killed before its ``cluster down`` can run, and
nothing else on the batch node knows the step is over. Under Slurm's proctrack/cgroup
the holder is killed with the batch script too (every process of the batch step, in
whatever session), before the step has ended: so the SIGTERM the batch system sends to
end the job removes the directory at once; each node's task takes its VM down itself.

Started as ``python -m hpcvm.cluster.internal holder STATE_DIR STEP_ARGV...``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

from hpcvm import timeline
from hpcvm.cluster.job import state_files as state


def main(argv: list[str]) -> int:
    timeline.mark_process_start("holder: process start")
    state_dir, *step = argv
    directory = Path(state_dir)
    started: list[subprocess.Popen[bytes]] = []

    def _forward(signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM and not state.taken_down_by_another(directory):
            state.remove_dir(directory)  # the job is ending: this process may not outlive it
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    # The step forwards SIGTERM to the tasks, which stop their VMs: pass ours on, and wait
    # (handlers first: a signal while the step starts is not lost).
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _forward)
    started.append(subprocess.Popen(step, stdin=subprocess.DEVNULL))
    timeline.mark("holder: step launched")
    code = started[0].wait()
    if state.taken_down_by_another(directory):
        return code  # `cluster down` (or a failed `up`) reads the events, then removes it
    if directory.is_dir():  # ended on its own (not by our SIGTERM): a later command says why
        state.write_ended(directory, code)
    state.remove_dir(directory)
    return code
