"""The few facts about a cluster's state directory that the holder needs (commands/holder.py).

Kept apart from job/state.py, which reads the nodes' events through pydantic models: the
holder is a fresh Python process in the path of every ``cluster up`` (it launches the
step), and importing job/state.py cost it 0.3 s of the 1.6 s `cluster up` took beyond one
``up`` (benchmarks/cluster_up.py's breakdown). This module imports nothing of hpcvm.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

LOG_FILE = "holder.log"  # the step's output, where the nodes' events arrive
TAKING_DOWN = "taking-down"  # written by `cluster down` (or a failing `up`) first
ENDED_SUFFIX = ".ended"  # beside the state directory: why a step ended on its own
# In every line of the holder's log that settles a dead source step's move (tasks/moved.py);
# ``cluster wait`` relays such lines as they come (job/state.py).
KILLED = "was killed (source step pid"


def taken_down_by_another(directory: Path) -> bool:
    """Whether ``cluster down`` (or a failing ``up``) is taking the cluster down: it
    reads the nodes' last events, then removes the directory itself."""
    return (directory / TAKING_DOWN).exists()


def remove_dir(directory: Path) -> None:
    """The cluster's state directory, and the clusters' directory once it is empty."""
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(OSError):
        directory.parent.rmdir()


def ended_path(directory: Path) -> Path:
    """The note a holder leaves beside the state directory it removed because its step
    ended on its own (a node's task died): what a later ``ps``, ``wait`` or ``down`` of
    that name says instead of "no cluster named"."""
    return directory.with_name(directory.name + ENDED_SUFFIX)


def write_ended(directory: Path, code: int) -> None:
    """Leave the note: the step's exit status and the batch system's last line naming a
    task (srun: ``error: node4: task 2: Killed``), read from the holder log."""
    try:
        lines = (directory / LOG_FILE).read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    tasks = [line.strip() for line in lines if ": task " in line and "error" in line]
    why = f"its step ended with exit {code} ({tasks[-1] if tasks else 'no task was named'})"
    with contextlib.suppress(OSError):
        ended_path(directory).write_text(why + "\n")
