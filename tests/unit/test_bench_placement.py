"""Native placement (bench/envs/placement.py) on real machines' topologies, planned by the
real planner: the expected PUs come from the plans themselves and from hwloc's node of
each PU (the host model hpcvm reads with hwloc), never from numbers written here."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.bench.envs.placement import ALL, native_placement, parse_native_cpus
from hpcvm.errors import UsageError
from hpcvm.host import discover
from hpcvm.host.model import HostTopology
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest, VMPlan
from hpcvm.units import GIB

XML = Path(__file__).resolve().parents[3] / "shared" / "topologies" / "xml"


@pytest.fixture(scope="module")
def host() -> HostTopology:
    return discover(xml=XML / "24em64t-2n6c2t-pci.xml")


def _plan(host: HostTopology, profile: str, vcpus: int = 4) -> VMPlan:
    request = PlanRequest(
        profile=profile,  # type: ignore[arg-type]
        vcpus=vcpus,
        memory_bytes=GIB,
        page_size_bytes=4096,
        accel="tcg",
    )
    return plan(host, request)


def _never() -> VMPlan:
    raise AssertionError("a pinned plan was not needed")


def test_the_most_tuned_pinned_vm_decides(host: HostTopology) -> None:
    plans = {"vm:naive": _plan(host, "naive"), "vm:pinned": _plan(host, "pinned")}
    placed = native_placement(None, plans, host, _never)
    pinned = plans["vm:pinned"]
    assert placed.cpus == pinned.vcpu_pus()
    node_of = {p.os_index: p.node for p in host.pus}
    assert placed.mems == tuple(sorted({node_of[c] for c in pinned.vcpu_pus()}))


def test_unpinned_vms_use_a_pinned_plan_of_their_size(host: HostTopology) -> None:
    pinned = _plan(host, "pinned")
    placed = native_placement(None, {"vm:naive": _plan(host, "naive")}, host, lambda: pinned)
    assert placed.cpus == pinned.vcpu_pus() and len(placed.cpus or ()) == 4


def test_explicit_all_and_native_only(host: HostTopology) -> None:
    first = min(p.os_index for p in host.pus)
    assert native_placement((first,), {}, host, _never).cpus == (first,)
    assert native_placement(ALL, {"vm:pinned": _plan(host, "pinned")}, host, _never).cpus is None
    assert native_placement(None, {}, host, _never).cpus is None


def test_bad_native_cpus_are_one_line_usage_errors(host: HostTopology) -> None:
    assert parse_native_cpus("0-2,5") == (0, 1, 2, 5)
    assert parse_native_cpus("all") == ALL and parse_native_cpus(None) is None
    with pytest.raises(UsageError, match="malformed --native-cpus"):
        parse_native_cpus("zero")
    with pytest.raises(UsageError, match="not PUs this process may use"):
        native_placement((9999,), {}, host, _never)
