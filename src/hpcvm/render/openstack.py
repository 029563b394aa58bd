"""A VMPlan as an OpenStack Nova flavor: vCPUs, RAM and the extra specs that Nova's
libvirt driver honours. Pure: no I/O.

Nova schedules and pins by itself: it picks the compute host, the host PUs of a
dedicated guest (from ``[compute] cpu_dedicated_set``) and the host node behind each
guest node. So a flavor asks for the plan's kind of guest: dedicated vCPUs, how SMT is
used, the guest's sockets/cores/threads, its NUMA nodes with their exact vCPU and memory
split, the page size, isolated emulator threads, locked memory and PCI aliases. Every
plan decision a flavor cannot carry (host PU and node numbers, distances, housekeeping
PUs, I/O threads, the CPU model, host tuning) comes back as a note instead of being
dropped. Extra spec names and values are those of Nova's extra spec reference; the
newest used is ``hw:locked_memory`` (Nova 2023.1).
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hpcvm.errors import UsageError
from hpcvm.plan.model import VMPlan
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
class FlavorRender:
    """The flavor (``name``, ``vcpus``, ``ram`` in MiB, ``disk`` in GiB,
    ``extra_specs``) and the notes on what it cannot say."""

    flavor: dict[str, Any]
    notes: tuple[str, ...] = ()

    @property
    def extra_specs(self) -> Specs:
        specs: Specs = self.flavor["extra_specs"]
        return specs


@dataclass
class _Parts:
    specs: Specs = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def openstack_flavor(plan: VMPlan) -> FlavorRender:
    """The flavor for ``plan`` and its notes. Raises UsageError for a plan Nova cannot
    hold at all (sizes that are not whole MiB, a guest node without vCPUs)."""
    check_renderable(plan)
    _check_nova(plan)
    parts = _Parts()
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
    return FlavorRender(flavor=flavor, notes=tuple(parts.notes))


def openstack_flavor_commands(plan: VMPlan) -> str:
    """The ``openstack flavor create`` and ``flavor set --property`` command lines,
    shell-quoted, after the notes as ``#`` comments (a runnable script that carries its
    caveats)."""
    render = openstack_flavor(plan)
    flavor = render.flavor
    header = f"hpcvm: plan {plan.name!r} (profile {plan.profile}) as an OpenStack flavor"
    lines = comment_lines(header, render.notes)
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


def _cpus(plan: VMPlan, parts: _Parts) -> None:
    """Pinned plans are ``dedicated``: one host PU per vCPU, never shared. The thread
    policy follows the guest topology: guest threads on host siblings need SMT hosts
    (``require``); a guest of one thread per core gets a physical core per vCPU with
    ``isolate``, which Nova (Train and later) fulfils by scheduling onto hosts without
    SMT. ``prefer``, the default, could put two vCPUs on the siblings of one core while
    the guest believes they are separate cores, which the planner avoids when it can."""
    if not plan.pinned:
        return
    threads = plan.topology.threads
    parts.specs["hw:cpu_policy"] = "dedicated"
    parts.specs["hw:cpu_thread_policy"] = "require" if threads > 1 else "isolate"
    parts.notes.append(
        "Nova picks the host PUs of a dedicated flavor itself ([compute] "
        f"cpu_dedicated_set); the plan's pins cannot be requested: {pins_text(plan)}"
    )
    if threads == 1:
        parts.notes.append(
            "hw:cpu_thread_policy=isolate gives each vCPU a physical core of its own, as "
            "the plan's guest topology (1 thread per core) shows it, and so schedules only "
            "onto compute hosts without SMT; 'prefer' admits SMT hosts but may pin two "
            "vCPUs on sibling threads of one core"
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


def _emulator(plan: VMPlan, parts: _Parts) -> None:
    """QEMU's emulator threads off the vCPUs' PUs (hpc): ``isolate`` gives them one more
    dedicated host core per guest, without any compute host configuration. Nova has no
    I/O thread setting."""
    if plan.iothreads:
        parts.notes.append(
            f"a flavor cannot set I/O threads: the plan's {plan.iothreads} I/O thread(s) "
            "are not expressed"
        )
    if not plan.emulator_pus:
        return
    parts.specs["hw:emulator_threads_policy"] = "isolate"
    parts.notes.append(
        "hw:emulator_threads_policy=isolate gives QEMU's emulator threads one extra "
        "dedicated host core Nova picks (one more PCPU in placement); the plan's "
        f"housekeeping cannot be named ({housekeeping_text(plan)}); with [compute] "
        "cpu_shared_set set to the housekeeping cores on each host, "
        "hw:emulator_threads_policy=share mirrors the plan instead"
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
