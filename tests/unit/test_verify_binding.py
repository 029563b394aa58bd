"""verify catches a VM whose memory is not where its plan says (issue 8), on /proc
captured from a real libvirt VM (tests/unit/data/verify/libvirt-numa2, memory bound
to host node 0): the recorded plan is changed to say node 1, the pages stay where the
kernel put them."""

from __future__ import annotations

from pathlib import Path

from hpcvm.plan.model import VMPlan
from hpcvm.runtime.verify import observe
from hpcvm.runtime.verify import vm as verify
from hpcvm.runtime.verify.vm import Observed

DATA = Path(__file__).parent / "data" / "verify" / "libvirt-numa2"


def _plan() -> VMPlan:
    return VMPlan.model_validate_json((DATA / "plan.json").read_text())


def _observed() -> Observed:
    sizes = observe.parse_maps_sizes((DATA / "maps").read_text())
    mappings = observe.with_sizes(observe.parse_numa_maps((DATA / "numa_maps").read_text()), sizes)
    return Observed(guest=None, mappings=tuple(mappings))


def _on_node(plan: VMPlan, node: int) -> VMPlan:
    memory = tuple(r.model_copy(update={"host_nodes": (node,)}) for r in plan.memory)
    return plan.model_copy(update={"memory": memory})


def test_captured_vm_has_no_unplanned_binding() -> None:
    assert verify.check_unplanned_binding(_plan(), _observed()) == []


def test_plan_saying_another_node_is_a_mismatch_naming_the_real_one() -> None:
    plan = _on_node(_plan(), 1)
    checks = verify.run_checks(plan, _observed())
    failed = {c.name: c for c in checks if not c.ok}
    unplanned = failed["memory bound outside the plan"]
    assert "bound to node 0" in unplanned.actual and "node 0: 512M" in unplanned.actual
    placement = failed["memory bound to host node 1 (2M pages)"]
    assert placement.actual.startswith("0M mapped") or placement.actual.startswith("0B mapped")
