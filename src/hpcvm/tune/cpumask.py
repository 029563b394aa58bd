"""The kernel's two ways of writing a CPU set: lists ('0-3,8') and hex masks ('ff,0').

/proc/irq/N/smp_affinity_list and kernel.watchdog_cpumask take lists;
/proc/irq/default_smp_affinity and the workqueue cpumask take masks, printed as 32-bit
hex groups separated by commas, most significant group first.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpcvm.units import format_cpu_list, parse_cpu_list


def parse_mask(text: str) -> frozenset[int]:
    """'3' -> {0, 1}; 'ff,00000001' -> {0, 32..39}. ValueError on non-hex text."""
    digits = text.strip().replace(",", "")
    value = int(digits, 16) if digits else 0
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def format_mask(cpus: Iterable[int]) -> str:
    """The kernel's mask form of ``cpus`` without leading zero groups: {0} -> '1',
    {33} -> '2,00000000'."""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    text = f"{value:x}"
    groups: list[str] = []
    while len(text) > 8:
        groups.insert(0, text[-8:])
        text = text[:-8]
    return ",".join([text, *groups])


def parse_list(text: str) -> frozenset[int]:
    """'0-2,5' -> {0, 1, 2, 5} (empty text: the empty set)."""
    return frozenset(parse_cpu_list(text))


def show(cpus: Iterable[int]) -> str:
    """A CPU set for people: the list form, or '-' when empty."""
    listed = format_cpu_list(frozenset(cpus))
    return listed or "-"
