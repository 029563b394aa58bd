"""The few facts about a cluster's state directory that the holder needs (holder.py).

Kept apart from state.py, which reads the nodes' events through pydantic models: the
holder is a fresh Python process in the path of every ``cluster up`` (it launches the
step), and importing state.py cost it 0.3 s of the 1.6 s `cluster up` took beyond one
``up`` (benchmarks/cluster_up.py's breakdown). This module imports nothing of hpcvm.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

TAKING_DOWN = "taking-down"  # written by `cluster down` (or a failing `up`) first


def taken_down_by_another(directory: Path) -> bool:
    """Whether ``cluster down`` (or a failing ``up``) is taking the cluster down: it
    reads the nodes' last events, then removes the directory itself."""
    return (directory / TAKING_DOWN).exists()


def remove_dir(directory: Path) -> None:
    """The cluster's state directory, and the clusters' directory once it is empty."""
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(OSError):
        directory.parent.rmdir()
