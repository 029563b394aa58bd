"""The one place that lists the tuning settings, in the order apply writes them.

Adding a setting is one class in ``hpcvm.tune.settings`` and one line here. Like every
extension point it is an ``hpcvm.registry.Registry``: a name that is not here is a
one-line UsageError naming the known ones (``get_setting``), never a silent default.
"""

from __future__ import annotations

from hpcvm.registry import Registry
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

REGISTRY: Registry[Setting] = Registry("tuning setting")
for _setting in _ALL:
    REGISTRY.register(_setting.name, _setting)


def get_setting(name: str) -> Setting:
    """The setting called ``name``; UsageError naming the known ones otherwise."""
    return REGISTRY.get_or_refuse(name)
