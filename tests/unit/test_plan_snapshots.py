"""plan() on every real machine snapshot x every profile x several sizes.

Each snapshot is planned twice: as recorded (most have no free huge pages, some no
huge page pools at all, so a refusal is a correct answer there) and "roomy" (the same
CPUs with 16G and plenty of free huge pages per node, made with model_copy), where the
only possible refusals are too many vCPUs or too much memory. Every plan is checked
against the invariants in tests/plan_checks.py.
"""

from __future__ import annotations

import re

import pytest

from hpcvm.errors import HpcvmError, InfeasiblePlanError, UsageError
from hpcvm.host import HostTopology
from hpcvm.plan import plan
from hpcvm.plan.model import PROFILE_NAMES, PlanRequest, ProfileName
from hpcvm.units import GIB, MIB
from tests.conftest import Snapshot
from tests.plan_checks import check_plan, host_from, roomy, vcpu_capacity

SMALL_MEMORY = 256 * MIB


def _host(snapshot: Snapshot) -> HostTopology:
    return host_from(snapshot.kind, str(snapshot.path))


def _sizes(host: HostTopology, profile: ProfileName) -> list[int]:
    """1 vCPU, half the usable PUs, all of them, one too many (hpc: minus housekeeping)."""
    cap = sum(vcpu_capacity(host, PlanRequest(profile=profile, vcpus=1, memory_bytes=GIB)).values())
    return sorted({1, max(1, cap // 2), max(1, cap), cap + 1})


def _beyond(host: HostTopology) -> int:
    return sum(n.memory_bytes for n in host.nodes) // GIB * GIB + 2 * GIB


def _page_variants(profile: ProfileName) -> list[int | None]:
    # numa/hpc with 4K pages: ordinary pages, still bound per node
    return [None, 4096] if profile in ("numa", "hpc") else [None]


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_roomy_snapshot_plans_every_feasible_size(snapshot: Snapshot, profile: ProfileName) -> None:
    """With room for memory, a plan exists exactly when the vCPUs fit the usable PUs."""
    host = roomy(_host(snapshot))
    for vcpus in _sizes(host, profile):
        for page in _page_variants(profile):
            request = PlanRequest(
                profile=profile, vcpus=vcpus, memory_bytes=SMALL_MEMORY, page_size_bytes=page
            )
            cap = sum(vcpu_capacity(host, request).values())
            if vcpus > cap:
                with pytest.raises(InfeasiblePlanError, match=rf"only {cap} PUs? (are|is) usable"):
                    plan(host, request)
                continue
            check_plan(host, request, plan(host, request))


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_memory_beyond_the_host_is_refused(snapshot: Snapshot, profile: ProfileName) -> None:
    host = roomy(_host(snapshot))
    request = PlanRequest(profile=profile, vcpus=1, memory_bytes=_beyond(host))
    # a host whose every core is housekeeping is refused for its CPUs first
    reason = "more than this host's" if vcpu_capacity(host, request) else "only 0 PUs are usable"
    with pytest.raises(InfeasiblePlanError, match=reason):
        plan(host, request)


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_recorded_snapshot_plans_or_refuses_cleanly(
    snapshot: Snapshot, profile: ProfileName
) -> None:
    """As recorded: a valid plan, or a one-line HpcvmError of the right kind."""
    host = _host(snapshot)
    for vcpus in _sizes(host, profile):
        for memory in (SMALL_MEMORY, _beyond(host)):
            request = PlanRequest(profile=profile, vcpus=vcpus, memory_bytes=memory)
            try:
                result = plan(host, request)
            except (UsageError, InfeasiblePlanError) as exc:
                assert "\n" not in str(exc) and str(exc)
                if vcpus > sum(vcpu_capacity(host, request).values()):
                    assert isinstance(exc, InfeasiblePlanError) or "page" in str(exc)
                continue
            except HpcvmError as exc:  # pragma: no cover - a wrong error class
                pytest.fail(f"unexpected {type(exc).__name__}: {exc}")
            assert memory == SMALL_MEMORY, "memory beyond the host must be refused"
            check_plan(host, request, result)


def test_huge_page_refusals_name_the_node_and_the_echo(snapshot: Snapshot) -> None:
    """A snapshot without free 2M pages: the numa refusal lists each used node with the
    pages it needs and an echo of (current total + shortfall)."""
    host = _host(snapshot)
    request = PlanRequest(profile="numa", vcpus=1, memory_bytes=SMALL_MEMORY)
    try:
        plan(host, request)
    except InfeasiblePlanError as exc:
        text = str(exc)
        if "offers no 2M huge pages" in text:
            pytest.skip("this host offers no 2M pages at all (checked in test_plan_rules)")
        if "huge pages" not in text:
            pytest.skip(f"refused for another reason: {text}")
        match = re.search(
            r"host node (\d+): the plan needs (\d+) .*?, (\d+) are (free|reserved)", text
        )
        assert match, text
        node, need, have = (int(match[i]) for i in (1, 2, 3))
        assert need == SMALL_MEMORY // (2 * MIB)
        pool = host.node(node).pool(2 * MIB)
        total = pool.total if pool else 0
        path = f"/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages"
        echo = re.search(rf"echo (\d+) > {re.escape(path)}", text)
        assert echo, text
        assert int(echo[1]) == total + need - have
    else:
        pytest.skip("this snapshot has enough free 2M pages")
