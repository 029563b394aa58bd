"""The marker a VM's run directory gets when the VM migrated away (migrate_node.py).

A module of its own so that every node task, which checks for it twice a second while
it holds its VM, need not import the migration code to do so (some 0.2 s of a task's
start, before its VM boots).
"""

from __future__ import annotations

from pathlib import Path

from hpcvm.runtime import paths
from hpcvm.runtime.model import Machine

MARKER = "migrated"  # in the old VM's run dir: its QEMU ended because the VM moved


def marker_path(name: str) -> Path:
    return paths.run_dir(name) / MARKER


def migrated_away(machine: Machine) -> bool:
    """Whether ``machine``'s VM migrated away (the source step left the marker)."""
    return marker_path(machine.name).exists()
