"""``plan(host, request)``: the tuned VM for one host, as data with its reasons.

Pure: reads only its arguments, returns a VMPlan or raises an HpcvmError (UsageError for
a malformed request, InfeasiblePlanError when this host cannot satisfy it). The order
of the steps is the order of the checks a person would make: request, devices,
accelerator, CPUs, guest topology, memory, QEMU's threads, tuning.
"""

from __future__ import annotations

from hpcvm.errors import UsageError
from hpcvm.host.model import HostTopology
from hpcvm.plan.cpu import choose_cpu
from hpcvm.plan.distances import distance_map
from hpcvm.plan.memory import MemoryPlan, flat_memory, numa_memory
from hpcvm.plan.model import GuestNode, PlanRequest, Profile, VMPlan
from hpcvm.plan.notes import Notes
from hpcvm.plan.passthrough import CheckedDevice, check_passthrough, passthrough_devices
from hpcvm.plan.placement import CpuLayout, Selection, host_layout, select_pus, too_many_vcpus
from hpcvm.plan.profiles import PROFILES
from hpcvm.plan.topology import GuestCpus, flat_guest, guest_distances, naive_guest, numa_guest
from hpcvm.plan.tuning import guest_kernel_args, host_tuning
from hpcvm.units import format_cpu_list


def plan(host: HostTopology, request: PlanRequest) -> VMPlan:
    """Plan the VM ``request`` asks for on ``host``; every choice lands in decisions."""
    profile = _profile(request)
    notes = Notes()
    notes.decide("profile", f"profile {profile.name}: {profile.description}")
    page = _validate(host, request, profile)
    devices = check_passthrough(host, request.passthrough) if profile.passthrough else []
    cpu = choose_cpu(host, request, profile, notes)
    distance = distance_map(host, notes)
    housekeeping = _housekeeping_cores(request, profile)
    layout = host_layout(host, housekeeping)
    selection = _select(host, request, profile, layout, devices, distance, housekeeping, notes)
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
    )


def _profile(request: PlanRequest) -> Profile:
    try:
        return PROFILES[request.profile]
    except KeyError:
        raise UsageError(
            f"unknown profile {request.profile!r}: use one of {', '.join(PROFILES)}"
        ) from None


def _validate(host: HostTopology, request: PlanRequest, profile: Profile) -> int:
    from hpcvm.plan.validate import validate_request

    return validate_request(host, request, profile)


def _select(
    host: HostTopology,
    request: PlanRequest,
    profile: Profile,
    layout: CpuLayout,
    devices: list[CheckedDevice],
    distance: dict[tuple[int, int], int],
    housekeeping: int,
    notes: Notes,
) -> Selection | None:
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
    prefer = [d.device.numa_node for d in devices if d.device.numa_node is not None]
    selection = select_pus(host, layout, request.vcpus, prefer, distance, housekeeping)
    if prefer:
        notes.decide(
            "nodes",
            f"host nodes {', '.join(map(str, selection.nodes))} chosen, the passthrough "
            f"device's node {prefer[0]} first, then the fewest nodes that hold the vCPUs",
        )
    else:
        notes.decide(
            "nodes",
            f"host node(s) {', '.join(map(str, selection.nodes))} chosen: the fewest nodes that "
            f"hold {request.vcpus} vCPUs, vCPUs split as evenly as they fit",
        )
    if selection.siblings_used:
        notes.warn(
            "some vCPUs run on SMT siblings of other vCPUs' cores (more vCPUs than free "
            "physical cores on the chosen nodes): siblings share a core's execution units"
        )
    return selection


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
    _describe_pinning(guest, selection, layout, notes)
    return guest


def _describe_pinning(
    guest: GuestCpus, selection: Selection, layout: CpuLayout, notes: Notes
) -> None:
    by_node: dict[int, list[tuple[int, int]]] = {}
    node_of_pu = {pu: n for n, pus in selection.pus.items() for pu in pus}
    for p in guest.placements:
        assert p.host_pu is not None
        by_node.setdefault(node_of_pu[p.host_pu], []).append((p.vcpu, p.host_pu))
    for node, pairs in by_node.items():
        vcpus = format_cpu_list([v for v, _ in pairs])
        pus = ",".join(str(pu) for _, pu in pairs)
        cores = selection.cores[node]
        deep = sum(1 for c in cores if len(c) > 1)
        smt = any(len(c) > 1 for c in layout.vcpu_cores[node])
        if deep:
            how = f"{len(cores)} physical cores, {deep} of them with SMT siblings pinned too"
        elif smt:
            how = "one PU per physical core; SMT siblings left idle"
        else:
            how = "one PU per physical core; the cores have no SMT siblings"
        notes.decide("vcpus", f"vCPU {vcpus} -> host PUs {pus} on host node {node} ({how})")


def _memory(
    host: HostTopology,
    request: PlanRequest,
    profile: Profile,
    page: int,
    selection: Selection | None,
    guest: GuestCpus,
    notes: Notes,
) -> tuple[tuple[GuestNode, ...], MemoryPlan]:
    if not profile.vnuma:
        first = selection.nodes[0] if selection else None
        return (), flat_memory(host, request.memory_bytes, page, first, notes)
    counts = [(h, len(v)) for h, v in guest.nodes]
    memory, sizes = numa_memory(host, request.memory_bytes, page, counts, notes)
    nodes = tuple(
        GuestNode(index=g, host_node=h, vcpus=v, memory_bytes=s)
        for g, ((h, v), s) in enumerate(zip(guest.nodes, sizes, strict=True))
    )
    for n in nodes:
        notes.decide(
            "numa",
            f"guest node {n.index} mirrors host node {n.host_node}: vCPUs "
            f"{format_cpu_list(list(n.vcpus))}, memory bound to host node {n.host_node}",
        )
    return nodes, memory


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
            f"host node {n}: PUs {format_cpu_list([p for c in layout.housekeeping[n] for p in c])}"
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
