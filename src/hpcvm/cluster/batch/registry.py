"""The batch systems a cluster job can run under, by name (batch/base.py says what one
must do). Like every extension point this is an ``hpcvm.registry.Registry``: a plugin
adds one with one ``register`` call (plugins.py), ``cluster up --batch`` offers every
name, and an unknown name is a one-line UsageError naming the known ones."""

from __future__ import annotations

from hpcvm.cluster.batch.base import BatchSystem
from hpcvm.cluster.batch.local import Local
from hpcvm.cluster.batch.slurm import Slurm
from hpcvm.registry import Registry

DEFAULT_BATCH = "slurm"

BATCH_SYSTEMS: Registry[BatchSystem] = Registry("batch system")
BATCH_SYSTEMS.register("slurm", Slurm())
BATCH_SYSTEMS.register("local", Local())


def get_batch(name: str) -> BatchSystem:
    """The batch system called ``name``; UsageError naming the known ones otherwise."""
    return BATCH_SYSTEMS.get_or_refuse(name)
