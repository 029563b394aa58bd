"""A VMPlan as an OpenStack Nova flavor: vCPUs, RAM and the extra specs that Nova's
libvirt driver honours, plus the compute host's side (nova.conf). Pure: no I/O.

Nova schedules and pins by itself: it picks the compute host, the host PUs of a
dedicated guest (from ``[compute] cpu_dedicated_set``) and the host node behind each
guest node. So a flavor asks for the plan's kind of guest: dedicated vCPUs, how SMT is
used, the guest's sockets/cores/threads, its NUMA nodes with their exact vCPU and memory
split, the page size, where emulator threads go, locked memory and PCI aliases. Every
plan decision a flavor cannot carry (host PU and node numbers, distances, I/O threads,
the CPU model, host tuning) comes back as a note instead of being dropped.

Given the host the plan was made for, the flavor is also one Nova can *schedule* there
(docs/openstack.md): Nova fits each guest NUMA node into a host node of its own and a
dedicated flavor without guest nodes into one host node, so plans that stack guest
nodes or spread a flat guest over host nodes are refused (InfeasiblePlanError) with
what to change; ``isolate`` forbids SMT hosts, so it is used only on hosts without SMT,
and one vCPU per core on an SMT host comes from ``cpu_dedicated_set`` listing one
thread per core, which the output prints with ``cpu_shared_set`` (the housekeeping PUs,
where ``hw:emulator_threads_policy=share`` puts QEMU's emulator threads). Extra spec
names and values are those of Nova's extra spec reference; the newest used is
``hw:locked_memory`` (Nova 2023.1).
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import GuestNode, VMPlan
from hpcvm.render.checks import check_renderable
from hpcvm.render.cloud import (
    comment_lines,
    device_label,
    distances_text,
    group_note,
    host_side_notes,
    housekeeping_text,
    hugepages_text,
    is_huge,
    node_map_text,
    pins_text,
)
from hpcvm.units import GIB, KIB, MIB, format_cpu_list, format_size

Specs = dict[str, str]


@dataclass(frozen=True)
class ComputeHost:
    """The compute host's ``[compute]`` sets that make Nova place the flavor as planned:
    ``dedicated`` (``cpu_dedicated_set``: PUs Nova pins vCPUs to, housekeeping cores
    excluded, one thread per core where the plan gives each vCPU a core of its own) and
    ``shared`` (``cpu_shared_set``: the plan's housekeeping PUs; empty: leave it unset)."""

    dedicated: tuple[int, ...]
    shared: tuple[int, ...] = ()


@dataclass(frozen=True)
class FlavorRender:
    """The flavor (``name``, ``vcpus``, ``ram`` in MiB, ``disk`` in GiB,
    ``extra_specs``), the notes on what it cannot say, and the compute host's side
    (None for an unpinned plan, or when rendered without the host)."""

    flavor: dict[str, Any]
    notes: tuple[str, ...] = ()
    compute: ComputeHost | None = None

    @property
    def extra_specs(self) -> Specs:
        specs: Specs = self.flavor["extra_specs"]
        return specs


@dataclass
class _Parts:
    host: HostTopology | None = None
    specs: Specs = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    compute: ComputeHost | None = None


def openstack_flavor(plan: VMPlan, host: HostTopology | None = None) -> FlavorRender:
    """The flavor for ``plan`` and its notes; with ``host`` (the machine the plan was
    made for) also the compute host's side, and only a flavor Nova can schedule there.
    Raises UsageError for a plan Nova cannot hold at all (sizes that are not whole MiB,
    a guest node without vCPUs), InfeasiblePlanError for one no schedulable flavor
    expresses (guest nodes stacked on one host node, a flat guest over host nodes)."""
    check_renderable(plan)
    _check_nova(plan)
    check_schedulable(plan, host)
    parts = _Parts(host=host)
    for group in (_topology, _cpus, _memory, _numa, _emulator, _devices, _cpu_model):
        group(plan, parts)
    parts.notes += host_side_notes(plan, "each compute host")
    flavor = {
        "name": plan.name,
        "vcpus": plan.vcpus,
        "ram": plan.memory_bytes // MIB,
        "disk": 0,  # the root disk comes from the image or a volume, not the flavor
        "extra_specs": parts.specs,
    }
    return FlavorRender(flavor=flavor, notes=tuple(parts.notes), compute=parts.compute)


def openstack_flavor_commands(plan: VMPlan, host: HostTopology | None = None) -> str:
    """The ``openstack flavor create`` and ``flavor set --property`` command lines,
    shell-quoted, after the notes and the compute host's nova.conf lines as ``#``
    comments (a runnable script that carries its caveats)."""
    render = openstack_flavor(plan, host)
    flavor = render.flavor
    header = f"hpcvm: plan {plan.name!r} (profile {plan.profile}) as an OpenStack flavor"
    lines = comment_lines(header, render.notes)
    if render.compute is not None:
        lines += nova_conf_lines(render.compute)
    create = shlex.join(
        [
            "openstack", "flavor", "create",
            "--vcpus", str(flavor["vcpus"]),
            "--ram", str(flavor["ram"]),
            "--disk", str(flavor["disk"]),
            flavor["name"],
        ]
    )  # fmt: skip
    lines.append(create + " \\")
    lines.append("  && " + shlex.join(["openstack", "flavor", "set", flavor["name"]]) + " \\")
    props = [f"--property {shlex.quote(f'{k}={v}')}" for k, v in render.extra_specs.items()]
    lines += [f"    {prop} \\" for prop in props[:-1]]
    lines.append(f"    {props[-1]}")
    return "\n".join(lines) + "\n"


def _check_nova(plan: VMPlan) -> None:
    """Nova counts RAM in whole MiB (flavor ``ram`` and ``hw:numa_mem.N``) and wants
    every guest NUMA node to have vCPUs (``hw:numa_cpus.N`` cannot be empty)."""
    sizes = [("memory", plan.memory_bytes)]
    sizes += [(f"guest node {n.index}'s memory", n.memory_bytes) for n in plan.guest_nodes]
    for what, size in sizes:
        if size % MIB:
            raise UsageError(
                f"plan {plan.name!r}: {what} ({size} bytes) is not a whole number of MiB, "
                "which a Nova flavor needs; plan with --memory in M or G"
            )
    for node in plan.guest_nodes:
        if not node.vcpus:
            raise UsageError(
                f"plan {plan.name!r}: guest node {node.index} has no vCPUs, which Nova "
                "cannot express (hw:numa_cpus.N needs at least one); plan more vCPUs"
            )


def nova_page_size(size: int) -> str:
    """``hw:mem_page_size`` for a huge page size: ``2MB``, ``1GB`` (Nova reads units as
    binary, 2MB = 2 MiB), or KiB digits for any other size (Nova's unit for digits)."""
    if size % GIB == 0:
        return f"{size // GIB}GB"
    if size % MIB == 0:
        return f"{size // MIB}MB"
    return str(size // KIB)


def _topology(plan: VMPlan, parts: _Parts) -> None:
    """The guest's sockets/cores/threads as planned (Nova would otherwise give one
    socket per vCPU). Nova has no dies: dies are folded into sockets."""
    t = plan.topology
    parts.specs["hw:cpu_sockets"] = str(t.sockets * t.dies)
    parts.specs["hw:cpu_cores"] = str(t.cores)
    parts.specs["hw:cpu_threads"] = str(t.threads)
    if t.dies > 1:
        parts.notes.append(
            f"Nova has no dies: the plan's {t.sockets} socket(s) x {t.dies} dies are "
            f"{t.sockets * t.dies} sockets in the flavor"
        )


def nova_conf_lines(compute: ComputeHost) -> list[str]:
    """The compute host's ``[compute]`` section as ``#`` lines (nova.conf is the
    operator's file: the script prints it and does not write it)."""
    lines = [
        "# nova.conf on each compute host like this machine (restart nova-compute after):",
        "#   [compute]",
        f"#   cpu_dedicated_set = {format_cpu_list(compute.dedicated)}",
    ]
    if compute.shared:
        lines.append(f"#   cpu_shared_set = {format_cpu_list(compute.shared)}")
    return lines


def check_schedulable(plan: VMPlan, host: HostTopology | None) -> None:
    """Refuse (InfeasiblePlanError, one line, what to change) a plan whose flavor Nova
    could never fit on its own host: Nova fits each guest NUMA node into a host node of
    its own, and gives a dedicated or page-sized flavor without ``hw:numa_nodes`` one
    implicit guest node that must fit into one host node."""
    if host is not None:
        known = {pu.os_index for pu in host.pus}
        unknown = sorted(set(plan.vcpu_pus()) - known)
        if unknown:
            raise UsageError(
                f"plan {plan.name!r} pins vCPUs to host PUs {format_cpu_list(unknown)}, "
                "which this host does not have; render it with the host it was planned on"
            )
    if plan.guest_nodes:
        _check_distinct_nodes(plan)
    elif plan.pinned or is_huge(plan):
        _check_one_node(plan, host)


def _check_distinct_nodes(plan: VMPlan) -> None:
    """Nova fits each guest node into a host node of its own, its vCPUs and memory both
    there. Guest nodes stacked on one host node by --guest-nodes: fewer guest nodes fix
    it. Stacked because non-local vCPUs (PUs of no node, or of a node outside
    cpuset.mems) take memory from another guest node's node: fewer guest nodes cannot
    (the planner mirrors every host domain used); fewer vCPUs, on local PUs only, can."""
    nodeless = [n for n in plan.guest_nodes if n.cpu_node is None and not n.local]
    if nodeless:
        raise InfeasiblePlanError(
            f"plan {plan.name!r}: guest node {nodeless[0].index} runs on host PUs that "
            "belong to no NUMA node, which Nova cannot dedicate (its host cells are the "
            f"NUMA nodes), so no flavor can be scheduled; plan with {_local_vcpus(plan)}"
        )
    seen: dict[int, GuestNode] = {}
    for node in plan.guest_nodes:
        other = seen.get(node.host_node)
        if other is None:
            seen[node.host_node] = node
            continue
        head = (
            f"plan {plan.name!r}: guest nodes {other.index} and {node.index} are both on "
            f"host node {node.host_node}, but Nova fits each guest NUMA node into a host "
            "node of its own, so no flavor can be scheduled; plan with "
        )
        if not (node.local and other.local):
            barred = node if not node.local else other
            raise InfeasiblePlanError(
                f"{head}{_local_vcpus(plan)}: guest node {barred.index}'s vCPUs run on "
                f"host node {barred.cpu_node}, which is outside cpuset.mems or has no memory"
            )
        used = len({n.host_node for n in plan.guest_nodes})
        raise InfeasiblePlanError(f"{head}--guest-nodes {used} (one per host node used) or fewer")


def _local_vcpus(plan: VMPlan) -> str:
    """Fewer vCPUs: as many as the guest nodes whose vCPUs' node holds their memory
    have; the planner keeps to such PUs while they suffice."""
    local = sum(len(n.vcpus) for n in plan.guest_nodes if n.local)
    return f"at most {local} vCPUs, as many as PUs whose own node holds their memory take"


def _check_one_node(plan: VMPlan, host: HostTopology | None) -> None:
    nodes: set[int | None] = set(plan.hugepages_needed)
    if host is not None:
        node_of = {pu.os_index: pu.node for pu in host.pus}
        nodes |= {node_of.get(pu) for pu in plan.vcpu_pus()}
    if len(nodes) > 1 or None in nodes:
        where = ", ".join("none" if n is None else str(n) for n in sorted(nodes, key=str))
        most = f"{_fewer_vcpus(plan, host)}, or " if host is not None else ""
        raise InfeasiblePlanError(
            f"plan {plan.name!r}: Nova confines a dedicated or page-sized flavor without "
            f"guest NUMA nodes to one host NUMA node, but the plan's flat guest uses host "
            f"nodes {where}; plan with {most}--profile numa (a guest node per host node)"
        )
    if host is not None and nodes:
        _check_node_memory(plan, host, next(n for n in nodes if n is not None))


def _check_node_memory(plan: VMPlan, host: HostTopology, index: int) -> None:
    """The implicit guest node takes all guest memory from the one host node: its pool
    of the plan's page size, or for small pages what the huge page pools leave."""
    node = next(n for n in host.nodes if n.os_index == index)
    page = plan.page_size_bytes
    pools = {p.size_bytes: p.total for p in node.hugepages}
    if is_huge(plan):
        have, need = pools.get(page, 0), plan.memory_bytes // page
        if have < need:
            raise InfeasiblePlanError(
                f"plan {plan.name!r}: Nova takes a flat guest's huge pages from the one "
                f"host node of its vCPUs, and node {index} has {have} {format_size(page)} "
                f"pages of the {need} needed; reserve them there (echo {need} > /sys/"
                f"devices/system/node/node{index}/hugepages/hugepages-{page // KIB}kB/"
                "nr_hugepages) or plan with --profile numa"
            )
        return
    small = (node.memory_bytes - sum(size * total for size, total in pools.items())) // MIB * MIB
    if small < plan.memory_bytes:
        raise InfeasiblePlanError(
            f"plan {plan.name!r}: Nova takes a flat dedicated guest's memory from the one "
            f"host node of its vCPUs, and node {index} has {format_size(small)} outside huge "
            f"page pools; plan with --memory {format_size(small)} or less, or --profile numa"
        )


def _fewer_vcpus(plan: VMPlan, host: HostTopology) -> str:
    """How many vCPUs a flat plan may have to stay on one host node, under the plan's
    --smt policy: with ``cores`` (the default) a re-plan with fewer vCPUs goes back to
    one vCPU per core, so the count is one node's whole cores, and --smt pack's count
    (every thread) is named beside it; it is not what this plan's shape would take."""
    if (plan.request.smt or "cores") != "cores":
        return f"at most {_node_capacity(plan, host, _shape(plan, host).per_core)} vCPUs"
    cores, threads = _node_capacity(plan, host, 1), _node_capacity(plan, host, 0)
    pack = f" ({threads} with --smt pack)" if threads > cores else ""
    return f"at most {cores} vCPUs{pack}"


def _node_capacity(plan: VMPlan, host: HostTopology, per_core: int) -> int:
    """The most vCPUs one host node's dedicated PUs take with ``per_core`` threads of
    each core (0: every usable thread)."""
    dedicated = _dedicated_set(plan, host, per_core)
    node_of = {pu.os_index: pu.node for pu in host.pus}
    counts = Counter(node_of[pu] for pu in dedicated if node_of[pu] is not None)
    return max(counts.values(), default=0)


@dataclass(frozen=True)
class _Shape:
    """How the plan's vCPUs use host cores, in Nova's words: ``policy`` is
    ``hw:cpu_thread_policy``; ``per_core`` the threads per core that
    ``cpu_dedicated_set`` lists (0: every usable one); ``note`` what Nova does
    differently, if anything."""

    policy: str
    per_core: int
    note: str | None = None


def _shape(plan: VMPlan, host: HostTopology) -> _Shape:
    """One vCPU per core: ``isolate`` on a host without SMT; on an SMT host ``prefer``
    with one thread per core dedicated (``isolate`` forbids the HW_CPU_HYPERTHREADING
    trait such a host has). Every used core holding the guest's threads: ``require``
    with that many threads per core dedicated (a host core may have more). Anything
    else (siblings on some cores only): ``prefer``, which fills siblings first."""
    core_of = {pu.os_index: pu.core for pu in host.pus}
    loads = sorted(Counter(core_of[pu] for pu in plan.vcpu_pus()).values(), reverse=True)
    threads = plan.topology.threads
    if set(loads) == {1}:
        smt = any(len(core.pus) > 1 for core in host.cores)
        return _Shape("prefer", 1) if smt else _Shape("isolate", 0)
    if threads > 1 and set(loads) == {threads}:
        return _Shape("require", threads)
    width = max(len(_usable(host, core.pus)) for core in host.cores)
    packed = [width] * (plan.vcpus // width) + ([plan.vcpus % width] if plan.vcpus % width else [])
    if loads == packed:
        return _Shape("prefer", 0)
    note = (
        f"the plan spreads its {plan.vcpus} vCPUs over {len(loads)} cores, siblings on "
        f"{sum(1 for n in loads if n > 1)} of them, because whole cores ran short; with "
        "every thread of each core in cpu_dedicated_set (below), Nova's "
        "hw:cpu_thread_policy=prefer fills every sibling of a core first and so takes "
        f"{len(packed)} cores: the guest is the same, its vCPUs share cores more than planned"
    )
    return _Shape("prefer", 0, note)


def _usable(host: HostTopology, pus: tuple[int, ...]) -> list[int]:
    ok = {pu.os_index for pu in host.pus if pu.online and pu.allowed}
    return sorted(pu for pu in pus if pu in ok)


def _dedicated_set(plan: VMPlan, host: HostTopology, per_core: int) -> tuple[int, ...]:
    """``cpu_dedicated_set``: per core with a NUMA node and no housekeeping PU, its
    first ``per_core`` usable threads (all with 0; cores with fewer are left out)."""
    reserved = set(plan.housekeeping_pus) | set(plan.emulator_pus) | set(plan.iothread_pus)
    out: list[int] = []
    for core in host.cores:
        if core.node is None or reserved & set(core.pus):
            continue
        usable = _usable(host, core.pus)
        take = usable if per_core == 0 else usable[:per_core]
        if take and (per_core == 0 or len(take) == per_core):
            out += take
    return tuple(sorted(out))


def _cpus(plan: VMPlan, parts: _Parts) -> None:
    """Pinned plans are ``dedicated``: one host PU per vCPU, never shared; the thread
    policy and ``cpu_dedicated_set`` follow how the plan uses SMT (``_shape``)."""
    if not plan.pinned:
        return
    parts.specs["hw:cpu_policy"] = "dedicated"
    parts.notes.append(
        "Nova picks the host PUs of a dedicated flavor itself ([compute] "
        f"cpu_dedicated_set); the plan's pins cannot be requested: {pins_text(plan)}"
    )
    if parts.host is None:
        _cpus_without_host(plan, parts)
        return
    shape = _shape(plan, parts.host)
    parts.specs["hw:cpu_thread_policy"] = shape.policy
    parts.compute = ComputeHost(
        dedicated=_dedicated_set(plan, parts.host, shape.per_core),
        shared=tuple(sorted(plan.housekeeping_pus)),
    )
    parts.notes.append(shape.note or _shape_note(shape))


def _shape_note(shape: _Shape) -> str:
    if shape.policy == "isolate":
        return (
            "hw:cpu_thread_policy=isolate: one physical core per vCPU; this host has no "
            "SMT (Nova forbids the HW_CPU_HYPERTHREADING trait, so such a flavor never "
            "lands on an SMT host)"
        )
    if shape.policy == "require":
        return (
            f"hw:cpu_thread_policy=require with {shape.per_core} threads of each core in "
            "cpu_dedicated_set (below): Nova packs vCPUs onto sibling threads as the "
            "plan's guest threads"
        )
    if shape.per_core == 1:
        return (
            "one vCPU per physical core on an SMT host: cpu_dedicated_set (below) lists "
            "one thread per core, so hw:cpu_thread_policy=prefer gives each vCPU a core "
            "of its own; isolate would forbid the HW_CPU_HYPERTHREADING trait this host "
            "has and never be scheduled here"
        )
    return (
        "hw:cpu_thread_policy=prefer with every thread of each core in "
        "cpu_dedicated_set (below): Nova fills a core's siblings first, as the plan does"
    )


def _cpus_without_host(plan: VMPlan, parts: _Parts) -> None:
    """Without the host, whether it has SMT is unknown: ``require`` for guest threads,
    else ``prefer`` (schedulable on any host), and the notes say what is unchecked."""
    threads = plan.topology.threads
    parts.specs["hw:cpu_thread_policy"] = "require" if threads > 1 else "prefer"
    parts.notes.append(
        "rendered without the host's topology: the compute host's cpu_dedicated_set "
        "(one thread per core for one vCPU per core on an SMT host) and whether Nova "
        "can fit this flavor on the host were not worked out"
    )


def _memory(plan: VMPlan, parts: _Parts) -> None:
    """The page size: huge pages by size; ``small`` for a pinned or NUMA guest on 4K
    pages, so that Nova accounts its memory per host node (a pinned guest is a NUMA
    guest to Nova); nothing for an unpinned flat guest (naive), as QEMU's defaults.
    ``hw:locked_memory`` where the QEMU line has ``mem-lock=on`` (hpc under KVM)."""
    if is_huge(plan):
        parts.specs["hw:mem_page_size"] = nova_page_size(plan.page_size_bytes)
        parts.notes.append(
            f"each compute host needs free {format_size(plan.page_size_bytes)} huge pages "
            f"on the node(s) Nova picks; the plan takes {hugepages_text(plan)}"
        )
    elif plan.pinned or plan.guest_nodes:
        parts.specs["hw:mem_page_size"] = "small"
    if (plan.pinned or is_huge(plan)) and not plan.guest_nodes:
        parts.notes.append(
            "Nova makes a dedicated or page-sized flavor without hw:numa_nodes a one-node "
            "guest confined to one host NUMA node; the plan's flat guest leaves its memory "
            "unbound"
        )
    if plan.profile == "hpc" and plan.accel == "kvm":
        parts.specs["hw:locked_memory"] = "true"
        parts.notes.append("hw:locked_memory needs Nova 2023.1 or later")
    if any(r.prealloc for r in plan.memory):
        parts.notes.append(
            "the plan preallocates guest memory at start (a short pool fails at start); "
            "a flavor cannot ask for preallocation"
        )


def _numa(plan: VMPlan, parts: _Parts) -> None:
    """One Nova guest node per planned guest node, with its exact vCPUs (``hw:numa_cpus``,
    a CPU list) and memory (``hw:numa_mem``, MiB); Nova binds each to one host node."""
    if not plan.guest_nodes:
        return
    parts.specs["hw:numa_nodes"] = str(len(plan.guest_nodes))
    for node in plan.guest_nodes:
        parts.specs[f"hw:numa_cpus.{node.index}"] = format_cpu_list(node.vcpus)
        parts.specs[f"hw:numa_mem.{node.index}"] = str(node.memory_bytes // MIB)
    parts.notes.append(
        "Nova maps each guest node to a host node of its choosing; the plan's mapping "
        f"cannot be requested: {node_map_text(plan)}"
    )
    if len(plan.guest_nodes) > 1:
        parts.notes.append(
            "a flavor cannot set guest NUMA distances; the plan's distance matrix is "
            f"not expressed: {distances_text(plan)}"
        )
    for node in plan.guest_nodes:
        if not node.local or (node.cpu_node is not None and node.cpu_node != node.host_node):
            cpus = "PUs without a node" if node.cpu_node is None else f"host node {node.cpu_node}"
            parts.notes.append(
                f"guest node {node.index}'s vCPUs run on {cpus} and its memory is on host "
                f"node {node.host_node} in the plan; Nova keeps a guest node's vCPUs and "
                "memory on one host node"
            )


def _emulator(plan: VMPlan, parts: _Parts) -> None:
    """QEMU's emulator threads on the plan's housekeeping PUs (hpc): ``share`` puts
    them on ``cpu_shared_set``, which the compute side sets to exactly those PUs, and
    costs no extra PCPU (``isolate`` would take one more dedicated core per guest, which
    the plan does not use). Nova has no I/O thread setting."""
    if plan.iothreads:
        parts.notes.append(
            f"a flavor cannot set I/O threads: the plan's {plan.iothreads} I/O thread(s) "
            "are not expressed"
        )
    if not plan.emulator_pus:
        return
    parts.specs["hw:emulator_threads_policy"] = "share"
    parts.notes.append(
        "hw:emulator_threads_policy=share runs QEMU's emulator threads on [compute] "
        f"cpu_shared_set, set to the plan's housekeeping PUs ({housekeeping_text(plan)}); "
        "without cpu_shared_set Nova floats them over the guest's own dedicated PUs, and "
        "cpu_shared_set also takes unpinned instances: keep those off this host"
    )


def _devices(plan: VMPlan, parts: _Parts) -> None:
    """PCI passthrough by alias (``name:count``) and NUMA affinity ``required``: the
    device on the guest's node, as the planner placed the vCPUs near it. The alias
    itself lives in nova.conf, which the plan cannot write."""
    if not plan.passthrough:
        return
    counts = Counter(device_label(dev) for dev in plan.passthrough)
    parts.specs["pci_passthrough:alias"] = ",".join(f"{a}:{n}" for a, n in counts.items())
    parts.specs["hw:pci_numa_affinity_policy"] = "required"
    for dev in plan.passthrough:
        alias = device_label(dev)
        parts.notes.append(
            f"PCI device {dev.bdf} ({dev.kind}) is alias {alias!r}: define it in nova.conf "
            f'on the API and compute hosts ([pci] alias = {{"name": "{alias}", '
            '"vendor_id": "VVVV", "product_id": "PPPP"} and a matching [pci] '
            f"device_spec; vendor:product from `lspci -n -s {dev.bdf}`); Nova passes any "
            f"matching device, not {dev.bdf} itself"
        )
        if dev.group_members:
            parts.notes.append(group_note(plan, dev.bdf, dev.group_members, "Nova", "alias"))


def _cpu_model(plan: VMPlan, parts: _Parts) -> None:
    """CPU model, CPU features, clock and accelerator are set per compute host in
    nova.conf ([libvirt] cpu_mode, virt_type), not per flavor: notes only."""
    model = plan.cpu.model
    if model == "host":
        parts.notes.append(
            "the CPU model is per compute host, not per flavor: [libvirt] cpu_mode = "
            "host-passthrough gives the plan's host CPU"
        )
    elif model is None:
        parts.notes.append(
            "the plan keeps QEMU's default CPU model (qemu64); Nova's default under KVM is "
            "host-model, set per compute host ([libvirt] cpu_mode), not per flavor"
        )
    else:
        parts.notes.append(
            f"the plan's CPU model {model!r} is set per compute host ([libvirt] cpu_mode "
            "and cpu_models), not per flavor"
        )
    if plan.cpu.features:
        features = ",".join(f"+{f}" for f in plan.cpu.features)
        parts.notes.append(
            f"a flavor cannot require the CPU features {features}; check the guest's flags "
            "on a Nova host"
        )
    if plan.accel == "tcg":
        parts.notes.append(
            "the plan is for TCG (software emulation); Nova's accelerator is [libvirt] "
            "virt_type per compute host (kvm, or qemu for TCG)"
        )
    elif plan.clock == "kvm-clock":
        parts.notes.append(
            "kvm-clock needs no extra spec: a Linux guest under KVM chooses it by itself"
        )
