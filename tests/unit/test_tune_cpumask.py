"""CPU masks and lists in the kernel's formats. The oracle for masks is the kernel's
bitmap format (lib/bitmap-str.c: 32-bit groups, most significant first, comma
separated, inner groups zero-padded) written out by hand, and the live kernel's own
files on this machine."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from hpcvm.tune.cpumask import format_mask, parse_list, parse_mask, show


def test_known_masks() -> None:
    assert format_mask({0}) == "1"
    assert format_mask({0, 1}) == "3"
    assert format_mask({33}) == "2,00000000"
    assert format_mask(range(40)) == "ff,ffffffff"
    assert parse_mask("ff,ffffffff") == frozenset(range(40))
    assert parse_mask("00000000,00000004") == {2}


@given(st.frozensets(st.integers(0, 300), min_size=1))
def test_mask_round_trip(cpus: frozenset[int]) -> None:
    assert parse_mask(format_mask(cpus)) == cpus
    assert parse_list(show(cpus)) == cpus


def test_this_kernels_masks_and_lists_agree() -> None:
    """The kernel prints the same set twice per IRQ: as a mask and as a list."""
    irqs = [p for p in Path("/proc/irq").iterdir() if p.name.isdigit()]
    assert irqs
    for irq in irqs:
        mask = (irq / "smp_affinity").read_text()
        listed = (irq / "smp_affinity_list").read_text()
        assert parse_mask(mask) == parse_list(listed), irq
