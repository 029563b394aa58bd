"""Variants of one profile are placed alike: only the variable they name differs.

A variant is planned by the same planner as its profile (bench/envs/vm.py ``plan_vm``), and
the planner may place a VM by its page size: huge pages free on one node and not on
another move the VM there. A ``vm:hpc+page=1G`` pinned to other PUs than ``vm:hpc`` would
measure two things at once. So before anything starts, every VM environment of one
profile in a run must have the same placement: the same vCPU pins and guest topology,
the same guest nodes on the same host nodes, QEMU's threads on the same PUs, memory
bound to the same nodes, the same CPU model and clock. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcvm.errors import InfeasiblePlanError
from hpcvm.plan.model import VMPlan
from hpcvm.units import format_cpu_list


def placement_of(plan: VMPlan) -> dict[str, Any]:
    """Everything of a plan that places the VM (module doc), as comparable data. The
    memory's page size and backing, and the size of each guest node's share (counted in
    MiB on small pages, in pages on huge ones: plan/memory.py ``split_unit``), are not
    placement."""
    return {
        "vcpu pins": [
            (p.vcpu, p.socket, p.die, p.core, p.thread, p.guest_node, p.host_pu)
            for p in plan.placements
        ],
        "guest topology": plan.topology.model_dump(),
        "guest nodes": [
            (n.index, n.host_node, n.vcpus, n.cpu_node, n.local) for n in plan.guest_nodes
        ],
        "QEMU's thread PUs": (plan.emulator_pus, plan.iothread_pus, plan.housekeeping_pus),
        "memory binding": [(m.guest_node, m.host_nodes, m.policy) for m in plan.memory],
        "CPU model": plan.cpu.model_dump(),
        "clock": plan.clock,
    }


def _pins(plan: VMPlan) -> str:
    return format_cpu_list(plan.vcpu_pus()) or "unpinned"


def check_placed_alike(plans: Mapping[str, VMPlan]) -> None:
    """InfeasiblePlanError naming the first environment placed unlike the first one of
    its profile, and what differs; ``plans`` by environment name, in the run's order."""
    first: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, plan in plans.items():
        mine = placement_of(plan)
        if plan.profile not in first:
            first[plan.profile] = (name, mine)
            continue
        other, theirs = first[plan.profile]
        differ = [k for k in mine if mine[k] != theirs[k]]
        if differ:
            raise InfeasiblePlanError(
                f"{name} would be placed unlike {other} ({', '.join(differ)} differ; vCPU "
                f"PUs {_pins(plan)} against {_pins(plans[other])}), so the two would differ "
                "in more than the variant: free huge pages of its size on the nodes "
                f"{other} uses (hpcvm plan shows where each goes), or drop {name}"
            )
