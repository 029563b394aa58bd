"""Where the native baseline runs: the tuned VM's own PUs and memory nodes.

A VM with N vCPUs pinned to PUs P on nodes M is compared with native runs on exactly P
and M (METHOD.md, "like for like"): comparing it with a native run over the whole host
would measure the host's size, not the VM's cost. The default takes the most tuned VM of
the run (hpc before numa, hugepages, pinned); a run whose only VMs are unpinned (naive)
uses the PUs a pinned plan of the same size would get, so the baseline still has the
VMs' CPU count. ``--native-cpus LIST`` overrides, ``all`` runs natively unconfined.
Pure: the plans and the host come in, nothing is read (how the confinement is enforced,
a cpuset or CPU affinity, is the kernel's answer: bench/envs/cpuset.py ``probe``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from hpcvm.errors import UsageError
from hpcvm.host.model import HostTopology
from hpcvm.model import Frozen
from hpcvm.plan.model import VMPlan
from hpcvm.plan.names import PROFILE_NAMES
from hpcvm.units import format_cpu_list, parse_cpu_list

ALL = "all"
# How native runs are held to their PUs and nodes: a cgroup cpuset (root, or a delegated
# cgroup), or what any user may do: CPU affinity, a bound memory policy, and mpirun's
# ranks bound to the same PUs (bench/envs/native.py).
Confinement = Literal["cpuset", "affinity"]
CONFINEMENT_TEXT: dict[str, str] = {
    "cpuset": "cgroup cpuset",
    "affinity": "CPU affinity + memory bind",
}


class NativePlacement(Frozen):
    """The PUs and memory nodes native runs are confined to (None: unconfined)."""

    cpus: tuple[int, ...] | None
    mems: tuple[int, ...] = ()
    source: str  # why these: "vm:hpc's vCPU PUs", "--native-cpus", "whole host"
    confine: Confinement = "cpuset"  # runs recorded before users had affinity: cpuset

    def describe(self) -> str:
        if self.cpus is None:
            return f"native: every PU this process may use ({self.source})"
        return (
            f"native: PUs {format_cpu_list(list(self.cpus))}, memory nodes "
            f"{format_cpu_list(list(self.mems))} ({self.source}; confined by "
            f"{CONFINEMENT_TEXT[self.confine]})"
        )


def parse_native_cpus(text: str | None) -> tuple[int, ...] | str | None:
    """``--native-cpus``: None (default), ``all``, or a CPU list like ``2-5,8``."""
    if text is None or text == ALL:
        return text
    try:
        cpus = tuple(parse_cpu_list(text))
    except ValueError:
        raise UsageError(
            f"malformed --native-cpus {text!r}: use a CPU list like 2-5,8 or all"
        ) from None
    if not cpus:
        raise UsageError("--native-cpus names no CPU: use a CPU list like 2-5,8 or all")
    return cpus


def _local_nodes(host: HostTopology, cpus: Sequence[int]) -> tuple[int, ...]:
    by_pu = {p.os_index: p for p in host.pus}
    nodes = {by_pu[c].node for c in cpus if c in by_pu and by_pu[c].node is not None}
    return tuple(sorted(n for n in nodes if n is not None and n >= 0))


def _check_cpus(host: HostTopology, cpus: Sequence[int]) -> None:
    usable = {p.os_index for p in host.pus if p.online and p.allowed}
    bad = [c for c in cpus if c not in usable]
    if bad:
        raise UsageError(
            f"--native-cpus {format_cpu_list(list(bad))}: not PUs this process may use "
            f"(usable: {format_cpu_list(sorted(usable))})"
        )


def _plan_nodes(plan: VMPlan, host: HostTopology) -> tuple[int, ...]:
    bound = {n for m in plan.memory if m.policy == "bind" for n in m.host_nodes}
    return tuple(sorted(bound)) or _local_nodes(host, plan.vcpu_pus())


def native_placement(
    requested: tuple[int, ...] | str | None,
    plans: Mapping[str, VMPlan],
    host: HostTopology,
    pinned_plan: Callable[[], VMPlan],
) -> NativePlacement:
    """Resolve the native confinement for a run whose VMs have ``plans`` (by env
    name). ``pinned_plan`` makes a pinned plan of the VMs' size when none is pinned."""
    if requested == ALL:
        return NativePlacement(cpus=None, source="--native-cpus all")
    if isinstance(requested, tuple):
        _check_cpus(host, requested)
        return NativePlacement(
            cpus=requested, mems=_local_nodes(host, requested), source="--native-cpus"
        )
    if not plans:
        return NativePlacement(cpus=None, source="no VM in this run")
    for profile in reversed(PROFILE_NAMES):
        # a profile's variants are placed like it (bench/envs/variant_plans.py): its first
        # environment in the run speaks for all of them
        name, plan = next(((n, p) for n, p in plans.items() if p.profile == profile), ("", None))
        if plan is not None and plan.pinned:
            return NativePlacement(
                cpus=plan.vcpu_pus(),
                mems=_plan_nodes(plan, host),
                source=f"the PUs and nodes of {name}'s vCPUs and memory",
            )
    plan = pinned_plan()
    return NativePlacement(
        cpus=plan.vcpu_pus(),
        mems=_plan_nodes(plan, host),
        source="the PUs a pinned VM of the same size would use (the run's VMs are unpinned)",
    )
