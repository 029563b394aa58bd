"""Device interrupts: every movable IRQ, and the default for IRQs set up later, go to
the housekeeping PUs, so no interrupt handler runs on a vCPU's PU."""

from __future__ import annotations

from pathlib import Path

from hpcvm.tune import cpumask, files
from hpcvm.tune.model import Change, Row, TuneTarget
from hpcvm.tune.settings.base import FileSetting, Setting

PROC_IRQ = Path("/proc/irq")
NOTE_IRQS = 6  # IRQs named in a check's note; the rest are counted


def irq_numbers() -> list[int]:
    """The IRQs the kernel lists now (a device can add or remove some at any time)."""
    if not PROC_IRQ.is_dir():
        return []
    return sorted(int(p.name) for p in PROC_IRQ.iterdir() if p.name.isdigit())


def affinity_path(irq: int) -> Path:
    return PROC_IRQ / str(irq) / "smp_affinity_list"


def irqbalance_running() -> bool:
    """Whether an irqbalance daemon runs: it would move the IRQs back within seconds."""
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == "irqbalance":
                return True
        except OSError:
            continue  # the process ended meanwhile
    return False


def affinities() -> dict[int, str]:
    """IRQ -> its smp_affinity_list text as read (IRQs gone meanwhile are left out)."""
    found: dict[int, str] = {}
    for irq in irq_numbers():
        raw = files.read(affinity_path(irq))
        if raw is not None:
            found[irq] = raw
    return found


class IrqAffinity(Setting):
    name = "irq_affinity"
    what = "every movable IRQ's affinity = housekeeping PUs: no device interrupt on a vCPU PU"

    def lacking(self) -> str | None:
        return None if PROC_IRQ.is_dir() else "no /proc/irq"

    def _off(self, target: TuneTarget) -> dict[int, str]:
        keep = set(target.housekeeping_pus)
        return {irq: raw for irq, raw in affinities().items() if cpumask.parse_list(raw) - keep}

    def check(self, target: TuneTarget) -> Row:
        wanted = cpumask.show(target.housekeeping_pus)
        if self.lacking():
            return self.lacked(wanted)
        total = len(irq_numbers())
        off = self._off(target)
        has = f"{total - len(off)} of {total} IRQs on housekeeping"
        note = ""
        if off:
            listed = [f"{irq}->{raw.strip()}" for irq, raw in sorted(off.items())]
            more = f" and {len(listed) - NOTE_IRQS} more" if len(listed) > NOTE_IRQS else ""
            note = "outside housekeeping: " + ", ".join(listed[:NOTE_IRQS]) + more
        balancer = irqbalance_running()
        if balancer:
            note = (note + "; " if note else "") + (
                "irqbalance is running and will move IRQs back: "
                "systemctl disable --now irqbalance (or ban the vCPU PUs in its config)"
            )
        return self.row(f"all IRQs -> {wanted}", has, not off and not balancer, note)

    def changes(self, target: TuneTarget) -> list[Change]:
        if self.lacking():
            return []
        value = cpumask.show(target.housekeeping_pus)
        return [
            Change(
                setting=self.name,
                path=str(affinity_path(irq)),
                before=raw,
                value=value,
                restore=raw.strip(),
                may_refuse=True,
            )
            for irq, raw in sorted(self._off(target).items())
        ]

    def _current(self) -> str:
        groups: dict[str, list[int]] = {}
        for irq, raw in affinities().items():
            groups.setdefault(raw.strip(), []).append(irq)
        return "; ".join(f"{cpus}: {len(irqs)} IRQs" for cpus, irqs in sorted(groups.items()))


class IrqDefaultAffinity(FileSetting):
    name = "irq_default_affinity"
    what = "/proc/irq/default_smp_affinity = housekeeping PUs: IRQs set up later start there"
    path = str(PROC_IRQ / "default_smp_affinity")

    def wanted(self, target: TuneTarget) -> str:
        return cpumask.format_mask(target.housekeeping_pus)

    def is_ok(self, value: str, target: TuneTarget) -> bool:
        return cpumask.parse_mask(value) <= set(target.housekeeping_pus)

    def shown(self, raw: str) -> str:
        return f"{raw.strip()} ({cpumask.show(cpumask.parse_mask(raw))})" if raw.strip() else ""
