"""Sizes as users type them ("2G", "512M", "4K") and as people read them.

Binary units throughout (1K = 1024 bytes), because page sizes, QEMU's ``size=`` and
libvirt's KiB all are binary.
"""

from __future__ import annotations

import re
from fractions import Fraction

from hpcvm.errors import UsageError

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB

_FACTORS = {"": 1, "B": 1, "K": KIB, "M": MIB, "G": GIB, "T": TIB}
# No machine addresses more: x86-64 and arm64 have at most 52-bit physical addresses.
# Larger sizes are typos, refused before any arithmetic turns them into nonsense.
MAX_SIZE = 2**52
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str, *, what: str = "size") -> int:
    """Parse a positive size like ``2G``, ``512M``, ``1.5G``, ``4096`` into bytes.

    Exact (a fraction, not a float). Raises UsageError naming ``what`` when the text is
    malformed, not positive, not whole bytes, or more than ``MAX_SIZE``.
    """
    match = _SIZE_RE.match(text)
    if not match:
        raise UsageError(
            f"malformed {what} {text!r}: use a number with an optional unit K, M, G or T "
            "(binary), e.g. 2G or 512M"
        )
    number, unit = match.groups()
    if len(number) > 40:
        raise _too_large(what, text)
    value = Fraction(number) * _FACTORS[unit.upper()]
    if value <= 0:
        raise UsageError(f"{what} must be positive, got {text!r}")
    if value > MAX_SIZE:
        raise _too_large(what, text)
    if value.denominator != 1:
        raise UsageError(f"{what} {text!r} is not a whole number of bytes")
    return int(value)


def _too_large(what: str, text: str) -> UsageError:
    return UsageError(
        f"{what} {text.strip()!r} is more than {format_size(MAX_SIZE)}, the most any machine "
        "can address (52-bit physical addresses): give the size you mean, e.g. 2G or 512M"
    )


def format_size(nbytes: int) -> str:
    """Shortest exact binary form: 2147483648 -> '2G', 1536 MiB -> '1536M'."""
    for unit, factor in (("T", TIB), ("G", GIB), ("M", MIB), ("K", KIB)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return f"{nbytes}B"


def human_size(nbytes: int) -> str:
    """Approximate human form for reports: 1.5 GiB, 300 MiB."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def format_cpu_list(cpus: list[int] | tuple[int, ...] | set[int] | frozenset[int]) -> str:
    """Kernel-style CPU list: [0,1,2,5,7,8] -> '0-2,5,7-8' (used by nohz_full, cpusets)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpu_list(text: str) -> list[int]:
    """Inverse of format_cpu_list; accepts the kernel's '0-3,8' form (and empty)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus
