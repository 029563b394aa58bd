"""The one place that lists the tuning settings, in the order apply writes them.

Adding a setting is one class in ``hpcvm.tune.settings`` and one line here. A name that
is not here is a one-line error (``get_setting``), never a silent default.
"""

from __future__ import annotations

from hpcvm.errors import UsageError
from hpcvm.tune.settings.base import Setting
from hpcvm.tune.settings.boot import IrqAffinityParam, Isolcpus, NohzFull, RcuNocbs
from hpcvm.tune.settings.cpu import Governor, ResumeLatency
from hpcvm.tune.settings.irq import IrqAffinity, IrqDefaultAffinity
from hpcvm.tune.settings.kernel import (
    NumaBalancing,
    StatInterval,
    TimerMigration,
    WatchdogCpumask,
    WorkqueueCpumask,
)
from hpcvm.tune.settings.memory import Ksm, TransparentHugepages

_ALL: tuple[Setting, ...] = (
    IrqDefaultAffinity(),
    IrqAffinity(),
    WorkqueueCpumask(),
    WatchdogCpumask(),
    TimerMigration(),
    StatInterval(),
    NumaBalancing(),
    Ksm(),
    TransparentHugepages(),
    Governor(),
    ResumeLatency(),
    Isolcpus(),
    NohzFull(),
    RcuNocbs(),
    IrqAffinityParam(),
)

REGISTRY: dict[str, Setting] = {s.name: s for s in _ALL}


def get_setting(name: str, registry: dict[str, Setting] | None = None) -> Setting:
    """The setting called ``name``; UsageError naming the known ones otherwise."""
    table = REGISTRY if registry is None else registry
    setting = table.get(name)
    if setting is None:
        raise UsageError(f"unknown tuning setting {name!r}: choose one of {', '.join(table)}")
    return setting
