"""Consistency checks a plan must pass before it is rendered.

The planner produces consistent plans, but a plan can also come from a JSON file a person
edited. QEMU and libvirt reject an inconsistent plan with messages that name their own
options, not the plan; these checks name the plan field instead, in one line.
"""

from __future__ import annotations

from hpcvm.errors import UsageError
from hpcvm.plan.model import VMPlan

#: QEMU fixes a node's distance to itself at 10 and accepts 10..255 between nodes. (A
#: Linux guest ignores a SLIT whose remote distances are <= 10; that is the planner's
#: choice to make, not the renderer's.)
LOCAL_DISTANCE = 10
MAX_DISTANCE = 255


def check_renderable(plan: VMPlan) -> None:
    """Raise UsageError naming the first inconsistency that would break a renderer."""
    _check_cpus(plan)
    _check_memory(plan)
    _check_distances(plan)


def _fail(plan: VMPlan, what: str) -> None:
    raise UsageError(f"plan {plan.name!r} cannot be rendered: {what}; re-run `hpcvm plan`")


def _check_cpus(plan: VMPlan) -> None:
    t = plan.topology
    if t.sockets * t.dies * t.cores * t.threads != plan.vcpus:
        _fail(plan, f"topology {t.sockets}x{t.dies}x{t.cores}x{t.threads} != {plan.vcpus} vCPUs")
    if [p.vcpu for p in plan.placements] != list(range(plan.vcpus)):
        _fail(plan, f"placements must list vCPUs 0..{plan.vcpus - 1} in order")
    if plan.guest_nodes and any(p.guest_node is None for p in plan.placements):
        _fail(plan, "a NUMA guest has a vCPU without a guest node")


def _check_memory(plan: VMPlan) -> None:
    total = sum(r.size_bytes for r in plan.memory)
    if plan.memory and total != plan.memory_bytes:
        _fail(plan, f"memory regions sum to {total} bytes, not memory_bytes {plan.memory_bytes}")
    for r in plan.memory:
        if r.backend == "file" and not r.mem_path:
            _fail(plan, f"memory region {r.id!r} is hugetlbfs-backed but has no mem_path")
        if r.size_bytes % r.page_size_bytes:
            _fail(plan, f"memory region {r.id!r} is not a multiple of its page size")
    if plan.guest_nodes:
        sizes = {r.guest_node: r.size_bytes for r in plan.memory}
        nodes = {n.index: n.memory_bytes for n in plan.guest_nodes}
        if sizes != nodes or len(plan.memory) != len(nodes):
            _fail(plan, "each guest node needs exactly one memory region of its size")
        if sorted(nodes) != list(range(len(nodes))):
            _fail(plan, "guest nodes must be numbered 0..n-1")
    elif len(plan.memory) > 1:
        _fail(plan, "a flat guest has more than one memory region")


def _check_distances(plan: VMPlan) -> None:
    n = len(plan.guest_nodes)
    d = plan.guest_distances
    if n and (len(d) != n or any(len(row) != n for row in d)):
        _fail(plan, f"guest_distances is not a {n}x{n} matrix")
    for i, row in enumerate(d):
        for j, val in enumerate(row):
            if i == j and val != LOCAL_DISTANCE:
                _fail(plan, f"guest node {i}'s distance to itself is {val}, must be 10")
            if i != j and not LOCAL_DISTANCE <= val <= MAX_DISTANCE:
                _fail(plan, f"distance {i}->{j} is {val}, must be in 10..255")
