"""Evidence gathered around samples: /proc/interrupts of this machine, clock reads, KVM
exit counters."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpcvm.bench.envs.evidence import (
    ClockRead,
    check_clock,
    exit_rate,
    interrupt_rates,
    kvm_exits,
    parse_interrupts,
    read_interrupts,
)
from hpcvm.errors import BenchmarkError

SAMPLE = """           CPU0       CPU1
 24:          1          0  IO-APIC   5-edge      ACPI:Ged
 36:          0     604006 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
 16:         10          5  IO-APIC  16-fasteoi   ehci_hcd:usb1, uhci_hcd:usb2
NMI:          0          0   Non-maskable interrupts
LOC:     287885     287243   Local timer interrupts
ERR:          0
"""


def test_sources_are_named_and_summed_over_cpus() -> None:
    counts = parse_interrupts(SAMPLE)
    assert counts == {
        "24:ACPI:Ged": 1,
        "36:virtio1-req.0": 604006,
        "16:ehci_hcd:usb1, uhci_hcd:usb2": 15,
        "NMI": 0,
        "LOC": 287885 + 287243,
        "ERR": 0,
    }


def test_this_machines_interrupts_parse_and_the_timer_line_matches_the_file() -> None:
    text = Path("/proc/interrupts").read_text()
    counts = parse_interrupts(text)
    loc = next(line for line in text.splitlines() if line.strip().startswith("LOC:"))
    ncpu = len(text.splitlines()[0].split())
    assert counts["LOC"] == sum(int(x) for x in loc.split()[1 : 1 + ncpu])


def test_rates_over_a_real_span_are_positive_and_only_for_sources_that_fired() -> None:
    before = read_interrupts()
    start = time.monotonic()
    time.sleep(0.3)
    after = read_interrupts()
    rates = interrupt_rates(before, after, time.monotonic() - start)
    assert rates, "no interrupt at all in 0.3 s"
    assert all(r > 0 for r in rates.values())
    assert set(rates) <= set(after)


def test_rates_ignore_counters_that_went_back_and_empty_spans() -> None:
    assert interrupt_rates({"A": 10, "B": 5}, {"A": 4, "B": 9, "C": 2}, 2.0) == {
        "B": 2.0,
        "C": 1.0,
    }
    assert interrupt_rates({"A": 1}, {"A": 9}, 0.0) == {}
    with pytest.raises(BenchmarkError):
        parse_interrupts("nothing like /proc/interrupts")


def test_clock_check_from_bracketed_reads() -> None:
    # Host midpoints 10.0 and 110.0; the guest saw 100.2 s pass: +0.2%.
    before = ClockRead(host_sent=9.99, host_received=10.01, guest=5000.0)
    after = ClockRead(host_sent=109.98, host_received=110.02, guest=5100.2)
    check = check_clock(before, after)
    assert check.host_seconds == pytest.approx(100.0)
    assert check.guest_seconds == pytest.approx(100.2)
    assert check.relative == pytest.approx(0.002)
    assert check.uncertainty == pytest.approx((0.02 + 0.04) / 2 / 100.0)
    assert check.resolved and check.flagged


def test_a_short_sample_cannot_resolve_drift_and_is_not_flagged() -> None:
    # 1 s sample, reads with 50 ms round trips: +0.5% apparent drift, +-5% uncertainty.
    before = ClockRead(host_sent=0.0, host_received=0.05, guest=0.025)
    after = ClockRead(host_sent=1.0, host_received=1.05, guest=1.030)
    check = check_clock(before, after)
    assert not check.resolved
    assert not check.flagged
    assert check.relative == pytest.approx(0.005)


def test_kvm_exits_unavailable_here_and_read_from_a_debugfs_layout(tmp_path: Path) -> None:
    """This host has no KVM debugfs (checked first); the readable case uses a directory
    laid out like /sys/kernel/debug/kvm, which cannot exist on this machine."""
    here = kvm_exits(1, Path("/sys/kernel/debug/kvm"))
    if not Path("/sys/kernel/debug/kvm").is_dir():
        assert here["available"] is False and "does not exist" in here["reason"]
    (tmp_path / "4242-11").mkdir()
    (tmp_path / "4242-11" / "exits").write_text("1500\n")
    before = kvm_exits(4242, tmp_path)
    (tmp_path / "4242-11" / "exits").write_text("2500\n")
    after = kvm_exits(4242, tmp_path)
    assert exit_rate(before, after, 4.0) == {"available": True, "exits": 1000, "per_second": 250.0}
    missing = kvm_exits(999, tmp_path)
    assert missing["available"] is False
    assert exit_rate(missing, missing, 1.0)["available"] is False
