"""The names a user types for a plan (profiles, SMT policies, accelerators), apart from
the plan's models so that option choices and ``--help`` cost no pydantic import."""

from __future__ import annotations

from typing import Literal

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
