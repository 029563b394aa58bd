"""Per-CPU power management on the vCPU PUs: no frequency ramp, no deep idle state.

A CPU latency limit is set per CPU through PM QoS (``power/pm_qos_resume_latency_us``)
rather than ``/dev/cpu_dma_latency``: the latter holds only while some process keeps
the device open, which a command that applies and exits cannot do, and it would keep
the housekeeping PUs out of deep idle too.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path

from hpcvm.tune import files
from hpcvm.tune.model import Change, Row, TuneTarget
from hpcvm.tune.settings.base import Setting

SYS_CPU = Path("/sys/devices/system/cpu")
LATENCY_LIMIT_US = 2  # allows C1/HLT (exit latency 1-2 us), forbids C1E and deeper


class PerCpuSetting(Setting):
    """One file per vCPU PU, each to hold the same value."""

    @abstractmethod
    def path(self, cpu: int) -> Path: ...

    @abstractmethod
    def wanted(self) -> str: ...

    def is_ok(self, value: str) -> bool:
        return value == self.wanted()

    def lacking_for(self, cpus: tuple[int, ...]) -> str | None:
        missing = [c for c in cpus if not self.path(c).exists()]
        if missing:
            return f"no {self.path(missing[0])}"
        return None

    def lacking(self) -> str | None:
        return self.lacking_for((0,))

    def _values(self, target: TuneTarget) -> dict[int, str]:
        values: dict[int, str] = {}
        for cpu in target.vcpu_pus:
            raw = files.read(self.path(cpu))
            values[cpu] = "" if raw is None else raw
        return values

    def check(self, target: TuneTarget) -> Row:
        wanted = f"{self.wanted()} on {','.join(map(str, target.vcpu_pus))}"
        why = self.lacking() or self.lacking_for(target.vcpu_pus)
        if why:
            return self.row(wanted, "absent", None, why)
        values = self._values(target)
        has = ", ".join(f"{cpu}:{raw.strip()}" for cpu, raw in values.items())
        return self.row(wanted, has, all(self.is_ok(raw.strip()) for raw in values.values()))

    def changes(self, target: TuneTarget) -> list[Change]:
        if self.lacking() or self.lacking_for(target.vcpu_pus):
            return []
        return [
            Change(
                setting=self.name,
                path=str(self.path(cpu)),
                before=raw,
                value=self.wanted(),
                restore=raw.strip(),
            )
            for cpu, raw in self._values(target).items()
            if not self.is_ok(raw.strip())
        ]

    def _current(self) -> str:
        cpus = sorted(
            int(p.name[3:])
            for p in SYS_CPU.glob("cpu[0-9]*")
            if self.path(int(p.name[3:])).exists()
        )
        return ", ".join(f"{c}:{(files.read(self.path(c)) or '').strip()}" for c in cpus) or "-"


class Governor(PerCpuSetting):
    name = "cpufreq_governor"
    what = "cpufreq governor 'performance' on the vCPU PUs: no frequency ramp-up after idle"

    def path(self, cpu: int) -> Path:
        return SYS_CPU / f"cpu{cpu}" / "cpufreq" / "scaling_governor"

    def wanted(self) -> str:
        return "performance"

    def lacking_for(self, cpus: tuple[int, ...]) -> str | None:
        why = super().lacking_for(cpus)
        if why:
            return f"{why}: no cpufreq driver"
        for cpu in cpus:
            offered = files.read(self.path(cpu).with_name("scaling_available_governors")) or ""
            if self.wanted() not in offered.split():
                return f"CPU {cpu}'s cpufreq driver has no 'performance' governor"
        return None


class ResumeLatency(PerCpuSetting):
    name = "cpu_latency"
    what = (
        f"PM QoS resume latency <= {LATENCY_LIMIT_US} us on the vCPU PUs: no deep C-state "
        "to wake from when a vCPU's work arrives"
    )

    def path(self, cpu: int) -> Path:
        return SYS_CPU / f"cpu{cpu}" / "power" / "pm_qos_resume_latency_us"

    def wanted(self) -> str:
        return str(LATENCY_LIMIT_US)

    def is_ok(self, value: str) -> bool:
        # "0" means no constraint; "n/a" means no idle state at all (stricter than asked)
        return value == "n/a" or (value.isdigit() and 0 < int(value) <= LATENCY_LIMIT_US)

    def lacking_for(self, cpus: tuple[int, ...]) -> str | None:
        why = super().lacking_for(cpus)
        if why:
            return why
        driver = (files.read(SYS_CPU / "cpuidle" / "current_driver") or "none").strip()
        if driver == "none":
            return "no cpuidle driver (idle is plain HLT): no idle state to limit"
        return None
