"""The names a user types for a plan (profiles, SMT policies, accelerators), apart from
the plan's models so that option choices and ``--help`` cost no pydantic import."""

from __future__ import annotations

import re
from typing import Literal

from hpcvm.errors import UsageError

ProfileName = Literal["naive", "pinned", "hugepages", "numa", "hpc"]
PROFILE_NAMES: tuple[ProfileName, ...] = ("naive", "pinned", "hugepages", "numa", "hpc")
AccelChoice = Literal["auto", "kvm", "tcg"]
ACCEL_CHOICES: tuple[AccelChoice, ...] = ("auto", "kvm", "tcg")
# How vCPUs meet SMT siblings (docs/planning.md); OpenStack's hw:cpu_thread_policy in
# brackets: "cores" one vCPU per physical core, siblings only when the host has fewer
# free cores than vCPUs (isolate, as long as the cores suffice); "pack" fewest nodes,
# a core's siblings filled together (prefer); "require" like pack on cores with
# siblings only, refused on a host without SMT (require).
SmtPolicy = Literal["cores", "pack", "require"]
SMT_POLICIES: tuple[SmtPolicy, ...] = ("cores", "pack", "require")
# The guest kernel's transparent huge page modes (``transparent_hugepage=`` on its
# command line, /sys/kernel/mm/transparent_hugepage/enabled inside it).
ThpMode = Literal["always", "madvise", "never"]
THP_MODES: tuple[ThpMode, ...] = ("always", "madvise", "never")
# The page sizes guest RAM may sit on (bytes): ordinary 4 KiB pages, 2 MiB and 1 GiB
# huge pages (x86-64's sizes; plan/profiles.py's PAGE_SIZES, kept here for --help).
PAGE_SIZE_CHOICES: tuple[int, ...] = (4 * 1024, 2 * 1024 * 1024, 1024 * 1024 * 1024)

# What a VM may be called: it names its run directory, its sockets, a libvirt domain and
# QEMU's ``-name``; here, apart from the plan's models, so that finding a running VM's
# directory (runtime/hostside/paths.py, for `exec`) imports no pydantic.
VM_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def check_vm_name(name: str) -> str:
    """``name`` if a VM may have it, else a UsageError saying what a name may be."""
    if not VM_NAME_RE.fullmatch(name):
        raise UsageError(
            f"invalid VM name {name!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            option="name",
        )
    return name
