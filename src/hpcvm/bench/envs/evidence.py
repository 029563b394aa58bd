"""Evidence of cause gathered around each sample (METHOD.md, "Evidence of cause").

- Interrupts per second per source: ``/proc/interrupts`` read before and after the run,
  natively on the host and, for a VM, inside the guest (the guest's own view: its timer,
  virtio and IPI interrupts) as well as on the host.
- Timekeeping: does the guest's clock keep time with the host's over the sample? A
  guest-side span measured by a wrapper around the benchmark cannot be compared with a
  host-side span measured around the agent call: the agent's round trips (process spawn,
  status polling) make every short sample look drifted. So the guest clock is *read*
  through the agent just before and just after the run, each read bracketed by host
  timestamps, as NTP does: the guest-minus-host offset is then known within each
  read's round trip, and the drift over the sample is the change of offset divided by
  the host span, with an uncertainty of the two half round trips over that span. A drift
  is flagged only when it exceeds the limit by more than its uncertainty, and a sample
  too short to resolve the limit says so instead of guessing.
- KVM exit counts from ``/sys/kernel/debug/kvm`` when debugfs exposes them (per VM:
  ``<qemu pid>-<fd>/exits``); recorded as unavailable, with why, otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcvm.errors import BenchmarkError
from hpcvm.model import Frozen
from hpcvm.stats import DRIFT_LIMIT, clock_drift

PROC_INTERRUPTS = Path("/proc/interrupts")
KVM_DEBUGFS = Path("/sys/kernel/debug/kvm")


# -- interrupts ---------------------------------------------------------------------------


def parse_interrupts(text: str) -> dict[str, int]:
    """Source -> count summed over CPUs, from the text of /proc/interrupts.

    Named sources keep their name (``LOC``, ``RES``, ``CAL``); numbered ones become
    ``<irq>:<devices>`` (``36:virtio1-req.0``) so that a reader can tell the device.
    """
    lines = text.splitlines()
    if not lines or not lines[0].split() or not lines[0].split()[0].startswith("CPU"):
        raise BenchmarkError("not the text of /proc/interrupts (no CPU header line)")
    ncpu = len(lines[0].split())
    counts: dict[str, int] = {}
    for line in lines[1:]:
        head, sep, rest = line.partition(":")
        if not sep:
            continue
        fields = rest.split()
        numbers: list[int] = []
        for field in fields[:ncpu]:
            if not field.isdigit():
                break
            numbers.append(int(field))
        if not numbers:
            continue
        irq = head.strip()
        desc = fields[len(numbers) :]
        if irq.isdigit():
            devices = " ".join(desc[2:]) if len(desc) > 2 else " ".join(desc)
            source = f"{irq}:{devices}" if devices else irq
        else:
            source = irq
        counts[source] = counts.get(source, 0) + sum(numbers)
    return counts


def read_interrupts(path: Path = PROC_INTERRUPTS) -> dict[str, int]:
    return parse_interrupts(path.read_text())


def interrupt_rates(
    before: Mapping[str, int], after: Mapping[str, int], seconds: float
) -> dict[str, float]:
    """Interrupts per second of every source that fired during the span.

    A source that appeared only afterwards counts from zero; counters never go back,
    so a negative delta (an IRQ line reassigned meanwhile) is dropped rather than
    reported as a negative rate.
    """
    if not seconds > 0:
        return {}
    rates: dict[str, float] = {}
    for source, count in after.items():
        delta = count - before.get(source, 0)
        if delta > 0:
            rates[source] = delta / seconds
    return dict(sorted(rates.items(), key=lambda kv: -kv[1]))


def total_rate(rates: Mapping[str, float]) -> float:
    return float(sum(rates.values()))


# -- timekeeping --------------------------------------------------------------------------


class ClockRead(Frozen):
    """One read of the guest clock through the agent, bracketed by host times.

    Host times are the host's monotonic clock; the guest time is whatever clock the
    guest read (its realtime clock, which nothing adjusts in hpcvm's guest). Only
    differences of guest times are used, so their origin does not matter.
    """

    host_sent: float
    host_received: float
    guest: float

    @property
    def round_trip(self) -> float:
        return self.host_received - self.host_sent

    @property
    def offset(self) -> float:
        """guest - host at the read, assuming it happened mid round trip."""
        return self.guest - (self.host_sent + self.host_received) / 2.0


class ClockCheck(Frozen):
    """Drift of the guest clock over one sample; see the module docstring."""

    host_seconds: float
    guest_seconds: float
    relative: float
    uncertainty: float  # bound on |relative error| from the reads' round trips
    limit: float
    resolved: bool  # uncertainty below the limit: the check can see a drift of `limit`
    flagged: bool  # |relative| > limit + uncertainty: drift beyond any doubt


def check_clock(before: ClockRead, after: ClockRead, limit: float = DRIFT_LIMIT) -> ClockCheck:
    """Compare the guest's and the host's elapsed time between two clock reads."""
    host_span = (after.host_sent + after.host_received) / 2.0 - (
        before.host_sent + before.host_received
    ) / 2.0
    guest_span = after.guest - before.guest
    drift = clock_drift(host_span, max(guest_span, 0.0), limit)
    uncertainty = (before.round_trip + after.round_trip) / 2.0 / host_span
    return ClockCheck(
        host_seconds=host_span,
        guest_seconds=guest_span,
        relative=drift.relative,
        uncertainty=uncertainty,
        limit=limit,
        resolved=uncertainty < limit,
        flagged=abs(drift.relative) > limit + uncertainty,
    )


def best_read(reads: list[ClockRead]) -> ClockRead:
    """The read with the shortest round trip: the tightest bound on the offset."""
    if not reads:
        raise BenchmarkError("no guest clock read succeeded")
    return min(reads, key=lambda r: r.round_trip)


# -- KVM exits ----------------------------------------------------------------------------


def kvm_exits(qemu_pid: int | None, root: Path = KVM_DEBUGFS) -> dict[str, Any]:
    """Exit count of one VM from KVM's debugfs, or why it is unavailable.

    Returns ``{"available": True, "exits": N}`` or ``{"available": False, "reason": ...}``.
    """
    if qemu_pid is None:
        return {"available": False, "reason": "no QEMU process"}
    if not root.is_dir():
        return {
            "available": False,
            "reason": f"{root} does not exist (debugfs not mounted or no KVM statistics)",
        }
    for vm_dir in sorted(root.glob(f"{qemu_pid}-*")):
        exits = vm_dir / "exits"
        try:
            return {"available": True, "exits": int(exits.read_text().split()[0])}
        except (OSError, ValueError, IndexError):
            continue
    return {"available": False, "reason": f"no KVM statistics for QEMU pid {qemu_pid} in {root}"}


def exit_rate(
    before: Mapping[str, Any], after: Mapping[str, Any], seconds: float
) -> dict[str, Any]:
    """KVM exits per second over a span, or the reason there is no figure."""
    if before.get("available") and after.get("available") and seconds > 0:
        delta = int(after["exits"]) - int(before["exits"])
        return {"available": True, "exits": delta, "per_second": delta / seconds}
    reason = after.get("reason") or before.get("reason") or "unavailable"
    return {"available": False, "reason": reason}
