"""The CPU step of a plan: which PUs run the vCPUs, chosen with their memory.

Unpinned profiles only check the count. Pinned ones run the domain search
(``choice.choose_domains``): for numa/hpc with a memory test, so nodes are chosen
that hold the vCPUs *and* their share of guest memory. The refusals name the fix:
fewer vCPUs, another ``--smt``, or the largest ``--memory`` some choice holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcvm.errors import InfeasiblePlanError
from hpcvm.host.model import HostTopology
from hpcvm.plan.choice import MemoryFit, choose_domains
from hpcvm.plan.explain import explain_selection
from hpcvm.plan.memory import (
    MemoryRefusal,
    about,
    accel_in_use,
    check_host_total,
    memory_fits,
    qemu_overhead,
)
from hpcvm.plan.model import PlanRequest, Profile
from hpcvm.plan.names import SmtPolicy
from hpcvm.plan.notes import Notes
from hpcvm.plan.passthrough import CheckedDevice
from hpcvm.plan.placement import CpuLayout, Selection, make_selection, smt_cores, too_many_vcpus
from hpcvm.plan.profiles import SMALL_PAGE
from hpcvm.plan.taken import NOBODY, Busy, describe_sharing, layouts
from hpcvm.units import format_cpu_list, format_size


def select(
    host: HostTopology,
    request: PlanRequest,
    profile: Profile,
    layout: CpuLayout,
    devices: list[CheckedDevice],
    distance: dict[tuple[int, int], int],
    housekeeping: int,
    page: int,
    notes: Notes,
    busy: Busy = NOBODY,
) -> Selection | None:
    """The PUs of the vCPUs (None: unpinned), off the PUs ``busy`` says the user's
    running VMs hold while others hold them (plan/taken.py)."""
    if not profile.pin:
        usable = len(host.usable_pus())
        if request.vcpus > usable:
            raise too_many_vcpus(host, layout, request.vcpus, housekeeping)
        notes.decide(
            "vcpus",
            f"{request.vcpus} vCPUs not pinned ({usable} usable host PUs): the host "
            "scheduler places and moves them, as QEMU does by default",
        )
        return None
    smt: SmtPolicy = request.smt or "cores"
    if sum(layout.capacity(n) for n in layout.vcpu_cores) < request.vcpus:
        raise too_many_vcpus(host, layout, request.vcpus, housekeeping)
    _check_smt_possible(layout, request.vcpus, smt)
    prefer = [d.device.numa_node for d in devices if d.device.numa_node is not None]
    fits: MemoryFit | None = None
    if profile.vnuma:
        if not host.allowed_nodes():
            raise InfeasiblePlanError(
                "no NUMA node with memory is inside this process's memory set (cgroup "
                "cpuset.mems), so guest memory cannot be bound: widen cpuset.mems or use "
                "--profile pinned"
            )

        total = request.memory_bytes
        accel = accel_in_use(host, request.accel)
        check_host_total(host, total, qemu_overhead(total, accel), page, accel)

        def fits(loads: Sequence[tuple[int, int]], strict: bool) -> bool:
            return memory_fits(host, total, page, loads, strict, accel)

    for view in layouts(layout, busy):
        choice = choose_domains(view, request.vcpus, prefer, smt, distance, fits)
        if choice is not None:
            break
    else:
        raise _memory_refusal(host, request, page)
    selection = make_selection(view, choice.domains, choice.shares, smt)
    explain_selection(host, request.vcpus, view, selection, choice, prefer, distance, notes)
    describe_sharing(selection, layout, busy, notes)
    return selection


def _check_smt_possible(layout: CpuLayout, vcpus: int, smt: SmtPolicy) -> None:
    if smt != "require":
        return
    have = sum(len(c) for cores in layout.vcpu_cores.values() for c in smt_cores(cores, smt))
    if have >= vcpus:
        return
    if have == 0:
        raise InfeasiblePlanError(
            "--smt require but no usable core of this host has two usable SMT siblings: "
            "use --smt cores or --smt pack",
            option="smt",
        )
    raise InfeasiblePlanError(
        f"--smt require: only {have} PUs sit on cores whose siblings are all usable, "
        f"{vcpus} vCPUs requested: use --vcpus {have} or fewer, or --smt pack",
        option="smt",
    )


def _memory_refusal(host: HostTopology, request: PlanRequest, page: int) -> MemoryRefusal:
    """No choice of nodes holds the memory (``plan`` names the largest size one would
    hold, or fewer vCPUs when none does)."""
    allowed = format_cpu_list([n.os_index for n in host.allowed_nodes()])
    kind = "ordinary memory" if page == SMALL_PAGE else f"memory for {format_size(page)} pages"
    return MemoryRefusal(
        f"no choice of host nodes holds {request.vcpus} vCPU(s) with "
        f"{format_size(request.memory_bytes)} of guest memory plus about "
        f"{about(qemu_overhead(request.memory_bytes, accel_in_use(host, request.accel)))} of "
        f"QEMU overhead ({kind} on the "
        f"allowed nodes {allowed}, shared in proportion to vCPUs)",
        nothing="use fewer --vcpus",
        nothing_option="vcpus",
    )
