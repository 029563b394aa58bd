"""``plan(host, request)``: the tuned VM for one host, as data with its reasons.

Pure: reads only its arguments, returns a VMPlan or raises an HpcvmError (UsageError for
a malformed request, InfeasiblePlanError when this host cannot satisfy it). The order
of the steps is the order of the checks a person would make: request, devices,
accelerator, CPUs, guest topology, memory, QEMU's threads, tuning.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcvm.errors import HpcvmError, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.plan.cpu import choose_cpu
from hpcvm.plan.distances import distance_map
from hpcvm.plan.explain import describe_pinning
from hpcvm.plan.memory import (
    MemoryPlan,
    MemoryRefusal,
    accel_in_use,
    flat_memory,
    largest_fitting,
    numa_memory,
)
from hpcvm.plan.model import GuestNode, PlanRequest, Profile, TakenPus, VMPlan
from hpcvm.plan.notes import Notes
from hpcvm.plan.passthrough import check_passthrough, passthrough_devices
from hpcvm.plan.placement import (
    NODELESS,
    CpuLayout,
    Selection,
    domain_name,
    host_layout,
    why_not_local,
)
from hpcvm.plan.profiles import PROFILES, SMALL_PAGE
from hpcvm.plan.select import select
from hpcvm.plan.taken import busy_pus
from hpcvm.plan.topology import GuestCpus, flat_guest, guest_distances, naive_guest, numa_guest
from hpcvm.plan.tuning import guest_kernel_args, guest_thp_args, host_tuning
from hpcvm.units import format_cpu_list


def plan(host: HostTopology, request: PlanRequest, taken: Sequence[TakenPus] = ()) -> VMPlan:
    """Plan the VM ``request`` asks for on ``host``; every choice lands in decisions.
    ``taken``: the PUs the user's running VMs hold, kept off this VM's vCPUs while
    other PUs are free (plan/taken.py). A refusal that a smaller ``--memory`` would
    lift names the largest size that plans here: found by planning it."""
    try:
        return _plan(host, request, taken)
    except MemoryRefusal as exc:
        raise exc.with_size(_largest_memory(host, request, taken)) from None


def _largest_memory(host: HostTopology, request: PlanRequest, taken: Sequence[TakenPus]) -> int:
    """The largest --memory below the request's that plans (0: none), in the unit
    ``validate`` accepts (whole MiB, whole pages of the plan's size)."""
    page = _validate(host, request, _profile(request))

    def plans(size: int) -> bool:
        try:
            _plan(host, request.model_copy(update={"memory_bytes": size}), taken)
        except HpcvmError:
            return False
        return True

    return largest_fitting(plans, request.memory_bytes - 1, page)


def _plan(host: HostTopology, request: PlanRequest, taken: Sequence[TakenPus]) -> VMPlan:
    profile = _profile(request)
    notes = Notes()
    notes.decide("profile", f"profile {profile.name}: {profile.description}")
    page = _validate(host, request, profile)
    devices = check_passthrough(host, request.passthrough) if profile.passthrough else []
    cpu = choose_cpu(host, request, profile, notes)
    distance = distance_map(host, notes)
    housekeeping = _housekeeping_cores(request, profile)
    layout = host_layout(host, housekeeping, distance)
    busy = busy_pus(taken)
    selection = select(
        host, request, profile, layout, devices, distance, housekeeping, page, notes, busy
    )
    guest = _guest_cpus(request, profile, selection, layout, notes)
    guest_nodes, memory = _memory(host, request, profile, page, selection, guest, notes)
    host_of_guest = [g.host_node for g in guest_nodes]
    first_guest = {h: i for i, h in reversed(list(enumerate(host_of_guest)))}
    hk = selection.housekeeping_pus if (selection and profile.housekeeping) else ()
    _describe_threads(profile, hk, selection, layout, notes)
    vcpu_pus = tuple(p.host_pu for p in guest.placements if p.host_pu is not None)
    # With --housekeeping 0 QEMU's own threads share the vCPU PUs (a small host's only
    # choice); they still stay off every other PU.
    qemu_pus = hk or (vcpu_pus if profile.housekeeping else ())
    tuning_host: tuple[str, ...] = ()
    tuning_guest: tuple[str, ...] = ()
    if hk:
        tuning_host = host_tuning(host, vcpu_pus, hk, page, memory.hugepages_needed, notes)
    if profile.housekeeping:
        tuning_guest = guest_kernel_args(request.vcpus, cpu.accel, notes)
    tuning_guest += guest_thp_args(request.guest_thp, notes)
    passthrough = passthrough_devices(devices, first_guest, notes)
    return VMPlan(
        name=request.name,
        profile=profile.name,
        request=request,
        host_source=host.source,
        host_cpu_model=host.cpu_model,
        accel=cpu.accel,
        accel_reason=cpu.accel_reason,
        vcpus=request.vcpus,
        memory_bytes=request.memory_bytes,
        topology=guest.topology,
        placements=guest.placements,
        guest_nodes=guest_nodes,
        guest_distances=guest_distances(host_of_guest, distance, notes) if guest_nodes else (),
        memory=memory.regions,
        page_size_bytes=page,
        host_thp=_host_thp(request, page, notes),
        hugepages_needed=memory.hugepages_needed,
        emulator_pus=qemu_pus,
        iothreads=1 if qemu_pus else 0,
        iothread_pus=qemu_pus,
        housekeeping_pus=hk,
        cpu=cpu.cpu,
        clock=cpu.clock,
        passthrough=passthrough,
        guest_kernel_args=tuning_guest,
        host_tuning=tuning_host,
        decisions=tuple(notes.decisions),
        warnings=tuple(notes.warnings),
        warning_kinds=tuple(notes.kinds),
    )


def _host_thp(request: PlanRequest, page: int, notes: Notes) -> bool:
    """Whether the host may put anonymous guest RAM on transparent huge pages: yes,
    unless 4K pages were asked for by name (then they must be 4K pages)."""
    if request.page_size_bytes != SMALL_PAGE or page != SMALL_PAGE:
        return True
    notes.decide(
        "memory",
        "guest RAM on the host's 4K pages, asked for by name: QEMU starts with transparent "
        "huge pages disabled for it (prctl PR_SET_THP_DISABLE), which it would otherwise "
        "ask the host for, so none of its RAM sits on 2M pages",
    )
    return False


def _profile(request: PlanRequest) -> Profile:
    try:
        return PROFILES[request.profile]
    except KeyError:
        raise UsageError(
            f"unknown profile {request.profile!r}: use one of {', '.join(PROFILES)}",
            option="profile",
        ) from None


def _validate(host: HostTopology, request: PlanRequest, profile: Profile) -> int:
    from hpcvm.plan.validate import validate_request

    return validate_request(host, request, profile)


def _guest_cpus(
    request: PlanRequest,
    profile: Profile,
    selection: Selection | None,
    layout: CpuLayout,
    notes: Notes,
) -> GuestCpus:
    if selection is None:
        return naive_guest(request.vcpus, notes)
    guest = (
        numa_guest(selection, request.guest_nodes, notes)
        if profile.vnuma
        else flat_guest(selection, notes)
    )
    describe_pinning(guest, selection, layout, notes)
    return guest


def _memory(
    host: HostTopology,
    request: PlanRequest,
    profile: Profile,
    page: int,
    selection: Selection | None,
    guest: GuestCpus,
    notes: Notes,
) -> tuple[tuple[GuestNode, ...], MemoryPlan]:
    accel = accel_in_use(host, request.accel)  # TCG's QEMU holds its translated code too
    if not profile.vnuma:
        first = selection.mem_node[selection.nodes[0]] if selection else None
        return (), flat_memory(host, request.memory_bytes, page, first, notes, accel)
    assert selection is not None  # vnuma profiles pin
    mem_of = {d: m for d, m in selection.mem_node.items() if m is not None}
    counts = [(mem_of[d], len(v)) for d, v in guest.nodes]
    memory, sizes = numa_memory(host, request.memory_bytes, page, counts, notes, accel)
    nodes = tuple(
        GuestNode(
            index=g,
            host_node=mem_of[d],
            vcpus=v,
            memory_bytes=s,
            cpu_node=None if d == NODELESS else d,
            local=mem_of[d] == d,
        )
        for g, ((d, v), s) in enumerate(zip(guest.nodes, sizes, strict=True))
    )
    for n in nodes:
        notes.decide("numa", _mirror_text(host, n))
    return nodes, memory


def _mirror_text(host: HostTopology, n: GuestNode) -> str:
    vcpus = format_cpu_list(list(n.vcpus))
    if n.local:
        return (
            f"guest node {n.index} mirrors host node {n.host_node}: vCPUs {vcpus}, memory "
            f"bound to host node {n.host_node}"
        )
    key = NODELESS if n.cpu_node is None else n.cpu_node
    where = (
        "an allowed node of their package (else the lowest allowed)"
        if n.cpu_node is None
        else "the nearest allowed node with memory, by distance"
    )
    return (
        f"guest node {n.index}: vCPUs {vcpus} run on PUs that {why_not_local(host, key)}; "
        f"memory bound to host node {n.host_node}, {where}: the guest sees this memory as "
        "local, which it is not"
    )


def _housekeeping_cores(request: PlanRequest, profile: Profile) -> int:
    """Cores per used node kept for QEMU's own threads: hpc only, 1 unless asked."""
    if not profile.housekeeping:
        return 0
    return 1 if request.housekeeping is None else request.housekeeping


def _describe_threads(
    profile: Profile,
    hk: tuple[int, ...],
    selection: Selection | None,
    layout: CpuLayout,
    notes: Notes,
) -> None:
    if hk and selection is not None:
        per_node = "; ".join(
            f"{domain_name(n)}: PUs "
            f"{format_cpu_list([p for c in layout.housekeeping[n] for p in c])}"
            for n in selection.nodes
        )
        cores = len(layout.housekeeping[selection.nodes[0]])
        notes.decide(
            "housekeeping",
            f"QEMU's emulator thread and 1 I/O thread on housekeeping PUs "
            f"{format_cpu_list(list(hk))}, all PUs of the {cores} lowest-numbered core(s) of "
            f"each used node ({per_node}), disjoint from the vCPU PUs",
        )
    elif selection is not None and profile.housekeeping:
        shared = format_cpu_list([p for pus in selection.pus.values() for p in pus])
        notes.warn(
            "--housekeeping 0: no housekeeping cores, so QEMU's emulator and I/O threads "
            f"share the vCPU PUs {shared} and add noise to "
            "them; host tuning that isolates the vCPU PUs is not recommended without them"
        )
        notes.decide(
            "housekeeping",
            "no housekeeping cores (--housekeeping 0): QEMU's emulator and I/O threads "
            f"pinned to the vCPU PUs {shared}",
        )
    elif selection is not None:
        notes.decide(
            "housekeeping",
            f"QEMU's emulator and I/O threads not restricted (profile {profile.name}): they "
            "may run on the vCPU PUs",
        )
