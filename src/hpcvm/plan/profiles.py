"""The five profiles: the reference study's steps from a default QEMU guest to a guest
tuned to the host. Each step adds one thing, so the overhead each thing removes can be
measured on its own (the study's figures compare exactly these steps)."""

from __future__ import annotations

from hpcvm.plan.model import Profile
from hpcvm.plan.names import PAGE_SIZE_CHOICES, ProfileName
from hpcvm.units import KIB, MIB

SMALL_PAGE = 4 * KIB
PAGE_SIZES: tuple[int, ...] = PAGE_SIZE_CHOICES

PROFILES: dict[ProfileName, Profile] = {
    "naive": Profile(
        name="naive",
        description="QEMU defaults: flat SMP guest, no pinning, anonymous memory, default CPU",
        pin=False,
        hugepages=False,
        vnuma=False,
        housekeeping=False,
        host_cpu=False,
        passthrough=False,
    ),
    "pinned": Profile(
        name="pinned",
        description="naive + 1:1 vCPU-to-PU pinning",
        pin=True,
        hugepages=False,
        vnuma=False,
        housekeeping=False,
        host_cpu=False,
        passthrough=False,
    ),
    "hugepages": Profile(
        name="hugepages",
        description="pinned + guest RAM on hugetlbfs (flat guest, memory not bound)",
        pin=True,
        hugepages=True,
        vnuma=False,
        housekeeping=False,
        host_cpu=False,
        passthrough=False,
    ),
    "numa": Profile(
        name="numa",
        description="guest NUMA nodes mirroring the host's, memory bound per node, "
        "pinning, huge pages",
        pin=True,
        hugepages=True,
        vnuma=True,
        housekeeping=False,
        host_cpu=False,
        passthrough=False,
    ),
    "hpc": Profile(
        name="hpc",
        description="numa + QEMU threads on housekeeping cores, host CPU model, invariant "
        "TSC, kvm-clock, passthrough devices",
        pin=True,
        hugepages=True,
        vnuma=True,
        housekeeping=True,
        host_cpu=True,
        passthrough=True,
    ),
}

# Profiles allowing huge pages, named in usage errors.
HUGEPAGE_PROFILES = tuple(name for name, p in PROFILES.items() if p.hugepages)


def default_page_size(profile: Profile) -> int:
    """2M for the huge page profiles (the common size every x86 host offers), 4K else."""
    return 2 * MIB if profile.hugepages else SMALL_PAGE


def page_dir_name(size_bytes: int) -> str:
    """The kernel's sysfs directory name for a huge page size: hugepages-2048kB."""
    return f"hugepages-{size_bytes // KIB}kB"
