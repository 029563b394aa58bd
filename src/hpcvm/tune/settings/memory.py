"""Memory daemons that scan or compact pages behind the guest: KSM and THP."""

from __future__ import annotations

import re

from hpcvm.tune.model import TuneTarget
from hpcvm.tune.settings.base import FileSetting

_CHOICE = re.compile(r"\[([^\]]+)\]")


class Ksm(FileSetting):
    name = "ksm"
    what = "KSM off: ksmd does not scan and merge guest pages (CPU time, copy-on-write faults)"
    path = "/sys/kernel/mm/ksm/run"
    lacking_reason = "kernel without CONFIG_KSM"

    def wanted(self, target: TuneTarget) -> str:
        return "0"


class TransparentHugepages(FileSetting):
    """'madvise': QEMU asks for huge pages on guest RAM (MADV_HUGEPAGE) and gets them,
    while khugepaged and compaction leave everyone else alone. With the guest on
    hugetlbfs THP plays no part, so 'never' is as good."""

    name = "thp"
    what = (
        "THP 'madvise': guest RAM still gets huge pages (QEMU asks), khugepaged stops "
        "compacting everything else"
    )
    path = "/sys/kernel/mm/transparent_hugepage/enabled"
    lacking_reason = "kernel without CONFIG_TRANSPARENT_HUGEPAGE"

    def wanted(self, target: TuneTarget) -> str:
        return "madvise"

    def is_ok(self, value: str, target: TuneTarget) -> bool:
        return value == "madvise" or (target.hugetlbfs and value == "never")

    def value_of(self, raw: str) -> str:
        match = _CHOICE.search(raw)
        return match.group(1) if match else raw.strip()
