"""Kernel housekeeping that wakes every CPU: NUMA balancing, timer migration, vmstat,
the soft-lockup watchdog and unbound workqueues."""

from __future__ import annotations

from hpcvm.tune import cpumask
from hpcvm.tune.model import TuneTarget
from hpcvm.tune.settings.base import FileSetting

STAT_INTERVAL = 10  # seconds; tuned's cpu-partitioning and realtime profiles use 10


class NumaBalancing(FileSetting):
    name = "numa_balancing"
    what = (
        "kernel.numa_balancing=0: no periodic page unmapping and migration behind pinned, "
        "node-bound guest memory"
    )
    path = "/proc/sys/kernel/numa_balancing"
    lacking_reason = "kernel without CONFIG_NUMA_BALANCING"

    def wanted(self, target: TuneTarget) -> str:
        return "0"


class TimerMigration(FileSetting):
    name = "timer_migration"
    what = (
        "kernel.timer_migration=0: timers stay on the CPU that armed them instead of "
        "being pushed onto busy (vCPU) CPUs"
    )
    path = "/proc/sys/kernel/timer_migration"
    lacking_reason = "kernel without CONFIG_NO_HZ_COMMON"

    def wanted(self, target: TuneTarget) -> str:
        return "0"


class StatInterval(FileSetting):
    name = "stat_interval"
    what = (
        f"vm.stat_interval>={STAT_INTERVAL}: per-CPU VM statistics folded every "
        f"{STAT_INTERVAL} s instead of every second"
    )
    path = "/proc/sys/vm/stat_interval"

    def wanted(self, target: TuneTarget) -> str:
        return str(STAT_INTERVAL)

    def is_ok(self, value: str, target: TuneTarget) -> bool:
        return value.isdigit() and int(value) >= STAT_INTERVAL


class WatchdogCpumask(FileSetting):
    name = "watchdog_cpumask"
    what = (
        "kernel.watchdog_cpumask=housekeeping: no soft-lockup watchdog timer and thread "
        "on the vCPU PUs"
    )
    path = "/proc/sys/kernel/watchdog_cpumask"
    lacking_reason = "kernel without CONFIG_LOCKUP_DETECTOR"

    def wanted(self, target: TuneTarget) -> str:
        return cpumask.show(target.housekeeping_pus)

    def is_ok(self, value: str, target: TuneTarget) -> bool:
        return cpumask.parse_list(value) <= set(target.housekeeping_pus)


class WorkqueueCpumask(FileSetting):
    name = "workqueue_cpumask"
    what = "unbound workqueues (kworkers) run on the housekeeping PUs only"
    path = "/sys/devices/virtual/workqueue/cpumask"

    def wanted(self, target: TuneTarget) -> str:
        return cpumask.format_mask(target.housekeeping_pus)

    def is_ok(self, value: str, target: TuneTarget) -> bool:
        return cpumask.parse_mask(value) <= set(target.housekeeping_pus)

    def shown(self, raw: str) -> str:
        return f"{raw.strip()} ({cpumask.show(cpumask.parse_mask(raw))})" if raw.strip() else ""
