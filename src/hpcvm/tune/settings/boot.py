"""Boot-time isolation: kernel command line parameters, checked against /proc/cmdline.

They cannot change while the kernel runs, so apply never touches them: ``--check``
shows what is missing and ``boot_advice`` prints the exact line to add and how
(Debian: /etc/default/grub, update-grub, reboot).
"""

from __future__ import annotations

import os
from abc import abstractmethod
from pathlib import Path
from typing import ClassVar

from hpcvm.host.sysfs import has_nohz_full
from hpcvm.plan.tuning import BOOT_CPU
from hpcvm.tune import cpumask, files
from hpcvm.tune.model import Change, Row, TuneTarget
from hpcvm.tune.settings.base import Setting

CMDLINE = Path("/proc/cmdline")
ISOLCPUS_FLAGS = "managed_irq,domain"


def cmdline_params() -> dict[str, str]:
    """name -> value of the running kernel's parameters (last one wins, as in the
    kernel); parameters after '--' belong to init and are left out."""
    params: dict[str, str] = {}
    for token in (files.read(CMDLINE) or "").split():
        if token == "--":
            break
        name, _, value = token.partition("=")
        params[name] = value
    return params


def split_isolcpus(value: str) -> tuple[str, frozenset[int]]:
    """'managed_irq,domain,2-3' -> ('managed_irq,domain', {2, 3})."""
    parts = value.split(",")
    flags = [p for p in parts if p and not p[0].isdigit()]
    cpus = ",".join(p for p in parts if p and p[0].isdigit())
    return ",".join(flags), cpumask.parse_list(cpus)


def _kernel_config_has(option: str) -> bool | None:
    """Whether /boot/config-<release> sets ``option``; None when there is no such file."""
    text = files.read(Path("/boot") / f"config-{os.uname().release}")
    if text is None:
        return None
    return any(line.startswith(f"{option}=") for line in text.splitlines())


class BootParam(Setting):
    """One kernel parameter naming a CPU set."""

    when = "boot"
    param: ClassVar[str]

    @abstractmethod
    def wanted(self, target: TuneTarget) -> str: ...

    @abstractmethod
    def is_ok(self, value: str | None, target: TuneTarget) -> bool: ...

    def lacking(self) -> str | None:
        return None

    def token(self, target: TuneTarget) -> str:
        return f"{self.param}={self.wanted(target)}"

    def check(self, target: TuneTarget) -> Row:
        if self.lacking():
            return self.lacked(self.token(target))
        value = cmdline_params().get(self.param)
        has = "not set" if value is None else f"{self.param}={value}"
        return self.row(self.token(target), has, self.is_ok(value, target))

    def changes(self, target: TuneTarget) -> list[Change]:
        return []

    def _current(self) -> str:
        value = cmdline_params().get(self.param)
        return "not set" if value is None else value


NOTHING_TO_ISOLATE = "none (CPU 0, the only vCPU PU, stays the kernel's)"


class _IsolatingParam(BootParam):
    """Parameters that name the PUs to isolate: they must cover the vCPU PUs but CPU 0
    (``TuneTarget.isolated_pus``) and must never name CPU 0 or a housekeeping PU. With
    no PU to isolate (a VM on CPU 0 alone), none is wanted."""

    def cpus(self, value: str) -> frozenset[int]:
        return cpumask.parse_list(value)

    def wanted(self, target: TuneTarget) -> str:
        return cpumask.show(target.isolated_pus())

    def token(self, target: TuneTarget) -> str:
        return super().token(target) if target.isolated_pus() else ""

    def check(self, target: TuneTarget) -> Row:
        row = super().check(target)
        if target.isolated_pus():
            return row
        return row.model_copy(update={"wanted": NOTHING_TO_ISOLATE})

    def is_ok(self, value: str | None, target: TuneTarget) -> bool:
        cpus = frozenset() if value is None else self.cpus(value)
        if cpus & ({BOOT_CPU} | set(target.housekeeping_pus)):
            return False
        isolated = set(target.isolated_pus())
        return not isolated or (value is not None and isolated <= cpus)


class Isolcpus(_IsolatingParam):
    name = "isolcpus"
    param = "isolcpus"
    what = (
        "isolcpus=managed_irq,domain: no load balancing onto the vCPU PUs, and kernel-managed "
        "IRQs kept off them"
    )

    def cpus(self, value: str) -> frozenset[int]:
        return split_isolcpus(value)[1]

    def wanted(self, target: TuneTarget) -> str:
        return f"{ISOLCPUS_FLAGS},{cpumask.show(target.isolated_pus())}"

    def is_ok(self, value: str | None, target: TuneTarget) -> bool:
        flags_ok = value is not None and "managed_irq" in split_isolcpus(value)[0].split(",")
        if target.isolated_pus() and not flags_ok:
            return False
        return super().is_ok(value, target)


class NohzFull(_IsolatingParam):
    name = "nohz_full"
    param = "nohz_full"
    what = "nohz_full: no scheduler tick on a vCPU PU that runs one task (its vCPU)"

    def lacking(self) -> str | None:
        # the same probe as the planner's host fact (HostTopology.nohz_full)
        if has_nohz_full(Path("/")):
            return None
        return "kernel without CONFIG_NO_HZ_FULL (no /sys/devices/system/cpu/nohz_full)"


class RcuNocbs(_IsolatingParam):
    name = "rcu_nocbs"
    param = "rcu_nocbs"
    what = "rcu_nocbs: RCU callbacks of the vCPU PUs run in kthreads on the housekeeping PUs"

    def lacking(self) -> str | None:
        if _kernel_config_has("CONFIG_RCU_NOCB_CPU") is False:
            return "kernel without CONFIG_RCU_NOCB_CPU"
        return None


class IrqAffinityParam(BootParam):
    name = "irqaffinity"
    param = "irqaffinity"
    what = "irqaffinity: interrupts start on the housekeeping PUs from boot on"

    def wanted(self, target: TuneTarget) -> str:
        return cpumask.show(target.housekeeping_pus)

    def is_ok(self, value: str | None, target: TuneTarget) -> bool:
        if not value:
            return False
        return cpumask.parse_list(value) <= set(target.housekeeping_pus)


def boot_advice(rows: list[Row], tokens: dict[str, str]) -> list[str]:
    """How to get the boot rows that are not ok: the exact parameters, and the Debian
    way to add them. ``tokens``: setting name -> the wanted ``param=value``."""
    missing = [r for r in rows if r.when == "boot" and r.ok is False]
    if not missing:
        return []
    line = " ".join(tokens[r.name] for r in missing if tokens[r.name])
    replace = [r.has for r in missing if r.has != "not set"]
    advice = [f"boot: add to the host kernel command line: {line}"] if line else []
    if replace:
        head = (
            "and remove what they replace" if line else "remove from the host kernel command line"
        )
        advice.append(f"boot: {head}: {' '.join(replace)}")
    advice.append(
        'boot: on Debian, append them inside GRUB_CMDLINE_LINUX="..." in /etc/default/grub, '
        "run `update-grub` and reboot; `hpcvm tune --check` then shows them ok"
    )
    return advice
