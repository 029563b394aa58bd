"""Planner plans for real machines' snapshots, rendered and read back.

For every snapshot in ../shared/topologies/ and every profile, the first size the
planner accepts is rendered for QEMU and libvirt and checked field by field against the
plan (tests/render_checks.py). Refusals are the planner's business and are tested there;
here a coverage test makes sure the accepted plans include the shapes that matter
(several guest nodes, SMT threads, hugetlbfs, KVM)."""

from __future__ import annotations

import functools

import pytest

from hpcvm.plan.model import VMPlan
from hpcvm.render import libvirt_xml, qemu_argv
from tests import render_plans as hand
from tests.conftest import Snapshot
from tests.render_checks import check_libvirt_domain, check_qemu_argv
from tests.render_plans import plans_for, snapshot_host, with_free_hugepages


@functools.cache
def _cached(snap: Snapshot) -> tuple[VMPlan, ...]:
    host = snapshot_host(snap)
    return tuple(plans_for(host, snap.name) + plans_for(with_free_hugepages(host), snap.name))


def test_snapshot_plans_render_as_planned(snapshot: Snapshot) -> None:
    plans = _cached(snapshot)
    if not plans:
        pytest.skip(f"the planner accepts no request on {snapshot.name}")
    for plan in plans:
        check_qemu_argv(plan, qemu_argv(plan))
        check_libvirt_domain(plan, libvirt_xml(plan))


def test_snapshot_plans_cover_the_shapes_that_matter(all_snapshots: list[Snapshot]) -> None:
    plans = [p for snap in all_snapshots for p in _cached(snap)]
    assert any(len(p.guest_nodes) > 1 for p in plans), "no multi-node guest"
    assert any(p.topology.threads > 1 for p in plans), "no SMT guest"
    assert any(r.backend == "file" for p in plans for r in p.memory), "no hugetlbfs plan"
    assert any(p.accel == "kvm" for p in plans), "no KVM plan"
    assert any(p.emulator_pus for p in plans), "no housekeeping plan"
    assert any(len(set(p.vcpu_pus())) > 1 and p.guest_nodes for p in plans)


@pytest.mark.parametrize("name", sorted(hand.all_plans()))
def test_whole_output_checks_accept_hand_built_plans(name: str) -> None:
    plan = hand.all_plans()[name]
    check_qemu_argv(plan, qemu_argv(plan))
    check_libvirt_domain(plan, libvirt_xml(plan))


def test_whole_output_checks_can_fail() -> None:
    """A plan's output checked against a different plan fails: cells and pins differ."""
    numa, pinned = hand.numa(), hand.pinned()
    with pytest.raises(AssertionError):
        check_qemu_argv(numa, qemu_argv(pinned))
    with pytest.raises(AssertionError):
        check_libvirt_domain(numa, libvirt_xml(hand.numa_4k()))
