"""Checks of a request's form against its profile and the host, before any placement.

These are the user's mistakes (a flag that the profile does not use, a size that is no
multiple of the page size, a name `up` would refuse), so they raise UsageError (exit 2),
each naming the flag to change. One is the host's limit instead: a huge page size the
host does not offer at all is an InfeasiblePlanError (exit 3), like too few free pages.
"""

from __future__ import annotations

from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import PlanRequest, Profile
from hpcvm.plan.names import check_vm_name
from hpcvm.plan.profiles import HUGEPAGE_PROFILES, PAGE_SIZES, SMALL_PAGE, default_page_size
from hpcvm.units import GIB, MIB, format_size

# What a VM may be called (plan/names.py) is checked here too, so that `hpcvm plan`
# refuses exactly what `hpcvm up` refuses.


def validate_request(host: HostTopology, request: PlanRequest, profile: Profile) -> int:
    """Check the request; return the page size the plan uses (bytes)."""
    check_vm_name(request.name)
    _check_counts(request)
    _check_flags_for_profile(request, profile)
    page = request.page_size_bytes or default_page_size(profile)
    _check_page_size(host, request, profile, page)
    _check_memory_size(request, page)
    _check_guest_thp(request)
    return page


def _check_counts(request: PlanRequest) -> None:
    if request.vcpus < 1:
        raise UsageError(f"--vcpus must be at least 1, got {request.vcpus}", option="vcpus")
    if request.memory_bytes <= 0:
        raise UsageError(
            f"--memory must be positive, got {request.memory_bytes} bytes", option="memory_bytes"
        )
    if request.memory_bytes % MIB:
        raise UsageError(
            f"--memory {request.memory_bytes} bytes is not a whole number of MiB: "
            "use a size like 2G or 1536M",
            option="memory_bytes",
        )


def _check_flags_for_profile(request: PlanRequest, profile: Profile) -> None:
    if request.housekeeping is not None:
        if not profile.housekeeping:
            raise UsageError(
                f"--housekeeping applies to --profile hpc only (got --profile {profile.name})",
                option="housekeeping",
            )
        if request.housekeeping < 0:
            raise UsageError(
                f"--housekeeping must be 0 or more cores per NUMA node, got {request.housekeeping}",
                option="housekeeping",
            )
    if request.guest_nodes is not None:
        if not profile.vnuma:
            raise UsageError(
                "--guest-nodes applies to --profile numa or hpc only "
                f"(got --profile {profile.name})",
                option="guest_nodes",
            )
        if request.guest_nodes < 1:
            raise UsageError(
                f"--guest-nodes must be at least 1, got {request.guest_nodes}", option="guest_nodes"
            )
        if request.guest_nodes > request.vcpus:
            raise UsageError(
                f"--guest-nodes {request.guest_nodes} needs at least as many vCPUs "
                f"(got --vcpus {request.vcpus}): every guest node holds at least one vCPU",
                option="guest_nodes",
            )
    if request.smt is not None and not profile.pin:
        raise UsageError(
            f"--smt applies to pinned profiles (pinned, hugepages, numa, hpc), not "
            f"--profile {profile.name}, whose vCPUs the host scheduler moves",
            option="smt",
        )
    if request.passthrough and not profile.passthrough:
        raise UsageError(
            f"--passthrough applies to --profile hpc only (got --profile {profile.name})",
            option="passthrough",
        )


def _check_page_size(host: HostTopology, request: PlanRequest, profile: Profile, page: int) -> None:
    if page not in PAGE_SIZES:
        raise UsageError(
            f"--page-size {format_size(page)} is not a page size: use 4K, 2M or 1G",
            option="page_size_bytes",
        )
    if page > SMALL_PAGE and not profile.hugepages:
        raise UsageError(
            f"--page-size {format_size(page)} needs huge pages, which --profile {profile.name} "
            f"does not use: use --profile {'/'.join(HUGEPAGE_PROFILES)} (or --page-size 4K)",
            option="page_size_bytes",
        )
    if page == SMALL_PAGE and profile.name == "hugepages":
        raise UsageError(
            "--profile hugepages with --page-size 4K is the pinned profile: "
            "use --profile pinned, or --page-size 2M or 1G",
            option="page_size_bytes",
        )
    if page > SMALL_PAGE:
        offered = host_page_sizes(host)
        if page not in offered:
            have = ", ".join(format_size(s) for s in sorted(offered)) or "none"
            how = "--page-size" if request.page_size_bytes else "the default --page-size"
            raise InfeasiblePlanError(
                f"the host offers no {format_size(page)} huge pages ({how}; huge page sizes "
                f"it reports: {have}): use --page-size "
                + " or ".join(format_size(s) for s in [*sorted(offered), SMALL_PAGE]),
                option="page_size_bytes",
            )


def _check_memory_size(request: PlanRequest, page: int) -> None:
    if request.memory_bytes % page:
        lower = request.memory_bytes // page * page
        upper = lower + page
        near = f"{format_size(lower)} or {format_size(upper)}" if lower else format_size(upper)
        raise UsageError(
            f"--memory {format_size(request.memory_bytes)} is not a multiple of the "
            f"{format_size(page)} page size: use --memory {near}",
            option="memory_bytes",
        )


# A Linux guest leaves transparent huge pages off, whatever its command line says, when
# its RAM less what the kernel keeps is below 512 MiB (mm/huge_memory.c hugepage_init).
# Measured with Debian 12's 6.1 guest kernel: a 512M guest shows "never" with
# transparent_hugepage=always, a 640M guest the mode asked for.
THP_MIN_MEMORY = 640 * MIB


def _check_guest_thp(request: PlanRequest) -> None:
    if request.guest_thp is not None and request.memory_bytes < THP_MIN_MEMORY:
        raise UsageError(
            f"--memory {format_size(request.memory_bytes)} is too little for a guest THP mode: "
            f"a Linux guest turns transparent huge pages off below 512 MiB of usable RAM "
            f"whatever its command line says; use --memory {format_size(THP_MIN_MEMORY)} or more",
            option="memory_bytes",
        )


# CPU flags that say the MMU can map a page of this size (x86: pse 2M, pdpe1gb 1G).
_PAGE_FLAGS = {2 * MIB: "pse", GIB: "pdpe1gb"}


def host_page_sizes(host: HostTopology) -> set[int]:
    """Huge page sizes the host offers: a pool on any node (an empty pool still counts:
    pages can be reserved), or a CPU flag saying the MMU maps that size (a snapshot
    without hugepages directories still describes a host that can reserve them)."""
    sizes = {pool.size_bytes for node in host.nodes for pool in node.hugepages}
    sizes |= {size for size, flag in _PAGE_FLAGS.items() if flag in host.cpu_flags}
    return sizes
