"""Property tests: plan() over hwloc synthetic machines (``hpcvm.host.synthetic``, i.e.
``lstopo --input "pack:2 numa:2 core:8 pu:2"``) with random requests, random offline or
disallowed PUs and random free huge page counts. Every answer is a plan meeting every
invariant of tests/plan_checks.py, or a one-line UsageError/InfeasiblePlanError, and
too many vCPUs is always refused as infeasible.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.host import HostTopology
from hpcvm.host.model import HugePagePool
from hpcvm.plan import plan
from hpcvm.plan.model import PROFILE_NAMES, PlanRequest
from hpcvm.units import GIB, MIB
from tests.plan_checks import check_plan, synthetic_host, vcpu_capacity

DESCRIPTIONS = (
    "pack:2 numa:2 core:8 pu:2",
    "numa:4 core:4 pu:1",
    "pack:1 numa:1 core:2 pu:2",
    "pack:4 numa:2 core:6 pu:2",
    "pack:2 numa:3 core:3 pu:4",
    "pack:1 core:6 pu:1",
)
TWO_M = 2 * MIB


@st.composite
def hosts(draw: st.DrawFn) -> HostTopology:
    """A synthetic machine with 16G per node, some PUs offline or outside the cpuset,
    some memory nodes outside cpuset.mems, the PUs of some node without a node (as when
    that node is offline), and a random number of free 2M and 1G pages per node."""
    host = synthetic_host(draw(st.sampled_from(DESCRIPTIONS)))
    ids = [p.os_index for p in host.pus]
    offline = draw(st.sets(st.sampled_from(ids), max_size=max(1, len(ids) // 4)))
    outside = draw(st.sets(st.sampled_from(ids), max_size=max(1, len(ids) // 4)))
    node_ids = [n.os_index for n in host.nodes]
    barred = draw(st.sets(st.sampled_from(node_ids), max_size=len(node_ids) - 1))
    nodeless = draw(st.sets(st.sampled_from(node_ids), max_size=1)) if len(node_ids) > 1 else set()
    pus = tuple(
        p.model_copy(
            update={
                "online": p.os_index not in offline,
                "allowed": p.os_index not in outside,
                "node": None if p.node in nodeless else p.node,
            }
        )
        for p in host.pus
    )
    cores = tuple(
        c.model_copy(update={"node": None if c.node in nodeless else c.node}) for c in host.cores
    )
    nodes = []
    for node in host.nodes:
        node = node.model_copy(
            update={
                "allowed": node.os_index not in barred,
                "pus": () if node.os_index in nodeless else node.pus,
            }
        )
        free2m = draw(st.integers(0, 3072))
        free1g = draw(st.integers(0, 4))
        pools = (
            HugePagePool(size_bytes=TWO_M, total=free2m + draw(st.integers(0, 64)), free=free2m),
            HugePagePool(size_bytes=GIB, total=free1g, free=free1g),
        )
        nodes.append(node.model_copy(update={"memory_bytes": 16 * GIB, "hugepages": pools}))
    return host.model_copy(update={"pus": pus, "cores": cores, "nodes": tuple(nodes)})


@st.composite
def requests(draw: st.DrawFn, host: HostTopology) -> PlanRequest:
    profile = draw(st.sampled_from(PROFILE_NAMES))
    huge = profile in ("hugepages", "numa", "hpc")
    page = draw(st.sampled_from([None, TWO_M, GIB] if huge else [None, 4096]))
    if profile in ("numa", "hpc") and draw(st.booleans()):
        page = 4096
    vcpus = draw(
        st.one_of(st.integers(1, len(host.pus) // 2 + 1), st.integers(1, len(host.pus) + 2))
    )
    step = max(page or (TWO_M if huge else 4096), MIB)
    # mostly small enough to fit, sometimes beyond a node or the host
    memory = step * draw(
        st.one_of(st.integers(1, 4 * GIB // step), st.integers(1, 96 * GIB // step))
    )
    guest_nodes = None
    if profile in ("numa", "hpc") and draw(st.booleans()):
        guest_nodes = draw(st.integers(1, min(vcpus, 6)))
    housekeeping = draw(st.sampled_from([None, 1, 2])) if profile == "hpc" else None
    smt = draw(st.sampled_from([None, "cores", "pack", "require"])) if profile != "naive" else None
    return PlanRequest(
        profile=profile,
        vcpus=vcpus,
        memory_bytes=memory,
        page_size_bytes=page,
        guest_nodes=guest_nodes,
        housekeeping=housekeeping,
        smt=smt,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_plan_or_clean_refusal(data: st.DataObject) -> None:
    host = data.draw(hosts())
    request = data.draw(requests(host))
    cap = sum(vcpu_capacity(host, request).values())
    try:
        result = plan(host, request)
    except InfeasiblePlanError as exc:
        assert "\n" not in str(exc)
        return
    except UsageError as exc:
        assert "\n" not in str(exc)
        assert request.vcpus <= cap, "too many vCPUs is infeasible, not a usage error"
        return
    assert request.vcpus <= cap, f"{request.vcpus} vCPUs planned on {cap} usable PUs"
    check_plan(host, request, result)


@settings(max_examples=150, deadline=None)
@given(
    description=st.sampled_from(DESCRIPTIONS),
    profile=st.sampled_from(PROFILE_NAMES),
    fraction=st.floats(0.0, 1.0),
)
def test_fitting_request_on_a_roomy_host_always_plans(
    description: str, profile: str, fraction: float
) -> None:
    """Enough memory and free pages everywhere: any vCPU count up to the usable PUs plans."""
    host = synthetic_host(description)
    pools = (HugePagePool(size_bytes=TWO_M, total=4096, free=4096),)
    host = host.model_copy(
        update={
            "nodes": tuple(
                n.model_copy(update={"memory_bytes": 16 * GIB, "hugepages": pools})
                for n in host.nodes
            )
        }
    )
    probe = PlanRequest.model_validate({"profile": profile, "vcpus": 1, "memory_bytes": GIB})
    cap = sum(vcpu_capacity(host, probe).values())
    if cap == 0:
        with pytest.raises(InfeasiblePlanError):
            plan(host, probe)
        return
    request = probe.model_copy(update={"vcpus": max(1, round(fraction * cap))})
    check_plan(host, request, plan(host, request))


@st.composite
def _rank_tables(draw: st.DrawFn) -> list[list[int]]:
    """Per domain, how many cores have a 1st, 2nd, ... PU: non-increasing, as when a
    cpuset leaves some cores fewer siblings than others."""
    tables = []
    for _ in range(draw(st.integers(1, 6))):
        depths = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
        tables.append([sum(1 for d in depths if d > r) for r in range(max(depths))])
    return tables


def _depth_reached(ranks: list[int], share: int) -> int:
    """The deepest rank (1-based) a domain reaches when its share is taken rank by rank."""
    reached, total = 0, 0
    while total < share:
        total += ranks[reached]
        reached += 1
    return reached


@settings(max_examples=300, deadline=None)
@given(tables=_rank_tables(), fraction=st.floats(0.0, 1.0))
def test_split_shares_fills_each_rank_everywhere_first(
    tables: list[list[int]], fraction: float
) -> None:
    """No domain takes a PU of rank r+1 while another chosen domain still has a core
    with a free PU of rank r (a third sibling before every core's second: the planner
    bug hypothesis found on a 6 x 3 x 4 host with a partial cpuset)."""
    from hpcvm.plan.placement import split_shares

    total = round(fraction * sum(map(sum, tables)))
    shares = split_shares(total, tables)
    assert sum(shares) == total
    for ranks, share in zip(tables, shares, strict=True):
        assert share <= sum(ranks)
        deepest = _depth_reached(ranks, share)
        for other, other_share in zip(tables, shares, strict=True):
            assert other_share >= sum(other[: max(deepest - 1, 0)]), (
                f"shares {shares} of {tables}: rank {deepest} taken while a domain "
                f"{other} still has rank {deepest - 1} free"
            )
