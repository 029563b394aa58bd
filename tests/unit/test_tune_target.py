"""Which PUs tuning quiets, from plans the planner makes on real machines' topologies,
and the refusals: no housekeeping PU left, a PU both vCPU and housekeeping, offline PUs,
an unpinned plan."""

from __future__ import annotations

import pytest

from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.plan.profiles import SMALL_PAGE
from hpcvm.tune.target import from_plan, validated
from tests.conftest import Snapshot
from tests.plan_checks import roomy
from tests.render_plans import plans_for, snapshot_host, with_free_hugepages


def test_every_planner_plan_gives_disjoint_nonempty_sets(snapshot: Snapshot) -> None:
    host = with_free_hugepages(roomy(snapshot_host(snapshot)))
    online = frozenset(p.os_index for p in host.pus if p.online)
    plans = plans_for(host, snapshot.name)
    assert any(p.pinned for p in plans), "the planner pinned no plan on this snapshot"
    for plan in plans:
        if not plan.pinned:
            with pytest.raises(UsageError, match="does not pin"):
                from_plan(plan, online, "p")
            continue
        if set(plan.vcpu_pus()) == online:
            with pytest.raises(InfeasiblePlanError, match="no housekeeping PU"):
                from_plan(plan, online, "p")
            continue
        target = from_plan(plan, online, "p")
        # oracle: the plan's own placements and the host's online PUs
        assert set(target.vcpu_pus) == {p.host_pu for p in plan.placements}
        assert not set(target.vcpu_pus) & set(target.housekeeping_pus)
        assert set(target.housekeeping_pus) <= online
        if plan.housekeeping_pus:
            assert target.housekeeping_pus == tuple(sorted(plan.housekeeping_pus))
        else:
            assert set(target.housekeeping_pus) == online - set(plan.vcpu_pus())
        assert target.hugetlbfs == (plan.page_size_bytes != SMALL_PAGE)


ONLINE = frozenset(range(8))


def test_housekeeping_defaults_to_every_other_online_pu() -> None:
    target = validated((2, 3), None, ONLINE, hugetlbfs=False, source="s")
    assert target.housekeeping_pus == (0, 1, 4, 5, 6, 7)


def test_no_housekeeping_left_is_refused() -> None:
    with pytest.raises(InfeasiblePlanError, match="no housekeeping PU is left"):
        validated(tuple(ONLINE), None, ONLINE, hugetlbfs=False, source="s")


def test_housekeeping_pu_is_never_isolated() -> None:
    with pytest.raises(UsageError, match="both vCPU and housekeeping"):
        validated((2, 3), (0, 3), ONLINE, hugetlbfs=False, source="s")


@pytest.mark.parametrize(("vcpus", "house"), [((9,), None), ((1,), (12,)), ((), None)])
def test_offline_or_missing_pus_are_refused(
    vcpus: tuple[int, ...], house: tuple[int, ...] | None
) -> None:
    with pytest.raises(UsageError) as info:
        validated(vcpus, house, ONLINE, hugetlbfs=False, source="s")
    assert "\n" not in str(info.value)
