"""Host tuning derived from a VM's pin set: check, apply, revert (see docs/tuning.md).

The settings are a registry (``hpcvm.tune.registry.REGISTRY``): each knows what it is
for, whether it changes at run time or needs a reboot, whether this host has it, what
the plan wants and which files to write. ``hpcvm.tune.engine`` applies them all or
nothing, saving every value to disk before it changes, so ``--revert`` restores exactly
what was there, also after a crash. ``snapshot_state`` is the cheap read-only view that
``bench`` records with every run.
"""

from typing import TYPE_CHECKING

from hpcvm.lazy import lazy_exports

if TYPE_CHECKING:
    from hpcvm.tune.snapshot import snapshot_state

__all__ = [
    "snapshot_state",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "hpcvm.tune.snapshot": ("snapshot_state",),
    },
)
