"""The host and each VM plan in the few facts a reader of a report checks first.

The store keeps the whole HostTopology and VMPlan as JSON. A report shows a summary of
them: the profile, where the vCPUs run, the guest NUMA nodes and the memory backing are
what decide the overhead. Pure functions over the stored JSON.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from hpcvm.plan.model import VMPlan
from hpcvm.report.model import HostSummary, PlanSummary
from hpcvm.units import format_cpu_list, human_size

SMALL_PAGE = 4096


def host_summary(host: dict[str, Any] | None) -> HostSummary | None:
    """Summary of a stored HostTopology; None when the run kept no host snapshot.

    Read as a dict, not revalidated: a report must still open a database written by an
    hpcvm whose host model has since gained fields.
    """
    if not host:
        return None
    nodes = host.get("nodes") or []
    kvm = host.get("kvm") or {}
    return HostSummary(
        hostname=str(host.get("hostname", "")),
        cpu_model=str(host.get("cpu_model", "")),
        packages=len(host.get("packages") or []),
        numa_nodes=len(nodes),
        cores=len(host.get("cores") or []),
        pus=len(host.get("pus") or []),
        memory_bytes=sum(int(n.get("memory_bytes", 0)) for n in nodes),
        kvm=str(kvm.get("reason", "")),
    )


def _pinning(plan: VMPlan) -> str:
    pairs = [(p.vcpu, p.host_pu) for p in plan.placements if p.host_pu is not None]
    if not pairs:
        return "not pinned (QEMU default: vCPU threads float over all host PUs)"
    return "vCPU->PU " + ", ".join(f"{v}->{pu}" for v, pu in pairs)


def _backing(plan: VMPlan) -> str:
    parts = []
    for region in plan.memory:
        if region.backend == "file":
            kind = f"hugetlbfs {human_size(region.page_size_bytes)} pages"
        else:
            kind = "anonymous memory, ordinary pages"
        bind = (
            f", bound to host node {format_cpu_list(region.host_nodes)}"
            if region.host_nodes and region.policy == "bind"
            else ", not bound"
        )
        parts.append(f"{region.id}: {human_size(region.size_bytes)} {kind}{bind}")
    return "; ".join(parts) or "QEMU default"


def plan_summary(plan: dict[str, Any] | None) -> PlanSummary | None:
    """Summary of a stored VMPlan; None natively. A plan this hpcvm cannot read (older
    or newer schema) is summarised from its profile and vCPU count alone."""
    if not plan:
        return None
    try:
        p = VMPlan.model_validate(plan)
    except ValidationError:
        unknown = "(plan schema not readable by this hpcvm)"
        return PlanSummary(
            profile=str(plan.get("profile", "?")),
            vcpus=int(plan.get("vcpus", 0)),
            topology=unknown,
            pinning=unknown,
            guest_nodes=(),
            memory_backing=unknown,
            cpu_model=unknown,
            clock=unknown,
            emulator_pus="",
        )
    t = p.topology
    nodes = tuple(
        f"guest node {n.index}: vCPUs {format_cpu_list(n.vcpus)}, "
        f"{human_size(n.memory_bytes)} on host node {n.host_node}"
        for n in p.guest_nodes
    )
    cpu = p.cpu.model or "QEMU default (qemu64)"
    if p.cpu.features:
        cpu += " +" + " +".join(p.cpu.features)
    return PlanSummary(
        profile=p.profile,
        vcpus=p.vcpus,
        topology=f"{t.sockets} socket x {t.cores} cores x {t.threads} threads",
        pinning=_pinning(p),
        guest_nodes=nodes or ("flat (no guest NUMA)",),
        memory_backing=_backing(p),
        cpu_model=cpu,
        clock=p.clock,
        emulator_pus=format_cpu_list(p.emulator_pus),
    )
