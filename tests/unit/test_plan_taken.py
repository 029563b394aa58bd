"""Issue 36: a new VM is planned beside the user's running VMs: its vCPUs keep off the
PUs (and cores) they hold while others are free, and the plan warns, naming the PUs and
the VMs, when it must share.

Pure planner on every real machine's topology in ../shared/topologies/ (made roomy, so
only CPUs decide) and on this host; which PUs share a core comes from hwloc's own view
(``lstopo``), not from hpcvm's parser. VMs are added one after the other until every
PU is held, as a user starting VM after VM would.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hpcvm.host import HostTopology, discover
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest, TakenPus, VMPlan
from hpcvm.units import GIB, MIB
from tests.conftest import Snapshot
from tests.plan_checks import roomy
from tests.unit.test_plan_real_machines import facts, lstopo_xml


def _host_and_cores(snapshot: Snapshot) -> tuple[HostTopology, dict[int, int]]:
    if snapshot.kind == "sysfs":
        host = discover(sysfs_root=snapshot.path)
        text = lstopo_xml(fsroot=snapshot.path)
    else:
        host = discover(xml=snapshot.path)
        text = lstopo_xml(xml=snapshot.path)
    return roomy(host), facts(text).core_of


def _held(taken: Sequence[TakenPus]) -> dict[int, int]:
    load: dict[int, int] = {}
    for vm in taken:
        for pu in {*vm.vcpu_pus, *vm.qemu_pus}:
            load[pu] = load.get(pu, 0) + 1
    return load


def _shared_warning(p: VMPlan) -> str | None:
    return next((w for w in p.warnings if w.startswith("vCPU PUs shared with")), None)


def _check_beside(
    p: VMPlan, taken: Sequence[TakenPus], usable: set[int], core_of: dict[int, int]
) -> None:
    """The new plan against what was held before it (module doc)."""
    load = _held(taken)
    new = set(p.vcpu_pus())
    held_cores = {core_of[pu] for pu in load}
    whole = {pu for pu in usable if core_of[pu] not in held_cores}
    free = usable - set(load)
    if len(whole) >= len(new):
        assert new <= whole, (new, sorted(load))
        assert _shared_warning(p) is None
    elif len(free) >= len(new):
        assert new <= free, (new, sorted(load))
        assert _shared_warning(p) is None
    else:
        warning = _shared_warning(p)
        assert warning is not None, p.warnings
        for pu in sorted(new & set(load)):
            owners = [vm.vm for vm in taken if pu in (*vm.vcpu_pus, *vm.qemu_pus)]
            assert f"PU {pu} with VM{'s' if len(owners) > 1 else ''} {', '.join(owners)}" in (
                warning
            )
        # no PU shared by more VMs than it must be: the most-held new PU is held by as
        # few VMs as the fewest that leave enough PUs
        enough = min(
            k for k in range(len(taken) + 1) if sum(load.get(u, 0) <= k for u in usable) >= len(new)
        )
        assert max(load.get(pu, 0) for pu in new) == enough


@pytest.mark.parametrize("profile", ["pinned", "numa"])
def test_vms_one_after_another_keep_off_each_others_pus(snapshot: Snapshot, profile: str) -> None:
    host, core_of = _host_and_cores(snapshot)
    usable = {pu.os_index for pu in host.usable_pus()}
    cores = len({core_of[pu] for pu in usable})
    size = max(1, cores // 3)
    taken: list[TakenPus] = []
    # until every PU is held, then two VMs more: those must share, and say so
    while sum(len(vm.vcpu_pus) for vm in taken) < len(usable) + 2 * size:
        name = f"vm{len(taken)}"
        request = PlanRequest.model_validate(
            {"name": name, "profile": profile, "vcpus": size, "memory_bytes": GIB, "accel": "tcg"}
        )
        p = plan(host, request, taken)
        _check_beside(p, taken, usable, core_of)
        taken.append(TakenPus(vm=name, vcpu_pus=p.vcpu_pus()))


def test_nothing_held_plans_as_before(snapshot: Snapshot) -> None:
    """VMs that pin nothing (naive) or PUs this host cannot use change nothing."""
    host, _ = _host_and_cores(snapshot)
    request = PlanRequest(profile="pinned", vcpus=2, memory_bytes=GIB, accel="tcg")
    alone = plan(host, request)
    unusable = max(pu.os_index for pu in host.pus) + 1
    beside = plan(host, request, [TakenPus(vm="a"), TakenPus(vm="b", vcpu_pus=(unusable,))])
    assert beside == alone


def test_this_host_two_then_a_third_shares_the_least_held_pu() -> None:
    host = discover()
    usable = sorted(pu.os_index for pu in host.usable_pus())
    request = PlanRequest(profile="pinned", vcpus=1, memory_bytes=256 * MIB, accel="tcg")
    taken: list[TakenPus] = []
    for name in ("a", "b", "c", "d"):
        p = plan(host, request.model_copy(update={"name": name}), taken)
        _check_beside(p, taken, set(usable), {pu: pu for pu in usable})
        taken.append(TakenPus(vm=name, vcpu_pus=p.vcpu_pus()))
    firsts = [vm.vcpu_pus[0] for vm in taken[: len(usable)]]
    assert sorted(firsts) == usable  # one VM per PU before any shares
    if len(usable) == 2:
        assert taken[3].vcpu_pus != taken[2].vcpu_pus  # d: the PU c did not take


def test_hpc_beside_a_pinned_vm_says_its_housekeeping_is_that_vms_vcpu_pu() -> None:
    """An hpc plan keeps the lowest core of each used node for QEMU's threads (as
    documented); when another VM's vCPU runs there it says so, and its vCPU keeps off."""
    host = discover()
    usable = sorted(pu.os_index for pu in host.usable_pus())
    if len(usable) < 2:
        pytest.skip("needs 2 usable PUs")
    request = PlanRequest(
        profile="hpc", vcpus=1, memory_bytes=256 * MIB, page_size_bytes=4096, accel="tcg"
    )
    alone = plan(host, request)
    (hk,) = alone.housekeeping_pus[:1]
    p = plan(host, request, [TakenPus(vm="a", vcpu_pus=(hk,))])
    assert hk not in p.vcpu_pus()
    assert any(f"PU {hk} with VM a" in w and "housekeeping" in w for w in p.warnings), p.warnings


def test_qemu_threads_of_another_vm_count_as_held() -> None:
    host = discover()
    usable = sorted(pu.os_index for pu in host.usable_pus())
    if len(usable) < 2:
        pytest.skip("needs 2 usable PUs")
    request = PlanRequest(profile="pinned", vcpus=1, memory_bytes=256 * MIB, accel="tcg")
    first = plan(host, request).vcpu_pus()[0]
    p = plan(host, request, [TakenPus(vm="a", vcpu_pus=(), qemu_pus=(first,))])
    assert first not in p.vcpu_pus()
    assert any(f"held PUs {first} kept free" in d.text for d in p.decisions)


def test_a_restored_guest_keeps_its_layout_and_says_it_shares(snapshot: Snapshot) -> None:
    """A restore re-plans the host side beside the live VMs, unless that changes the
    guest the checkpoint saved (its ABI, as the restore compares it): then the guest's
    own layout, on PUs the live VMs hold, with a warning. Here: numa guests whose node
    count would change if every node's first PU were avoided."""
    from hpcvm.bootspec import BootSpec
    from hpcvm.runtime.checkpoint.model import abi_differences, guest_abi
    from hpcvm.runtime.machine.planning import plan_same_guest

    host, _ = _host_and_cores(snapshot)
    nodes = sorted({pu.node for pu in host.usable_pus() if pu.node is not None})
    boot = BootSpec()
    request = PlanRequest(profile="numa", vcpus=2, memory_bytes=GIB, accel="tcg")
    saved = guest_abi(plan(host, request), boot)
    first_pus = {n: min(p.os_index for p in host.usable_pus() if p.node == n) for n in nodes}
    held = [TakenPus(vm=f"n{n}", vcpu_pus=(pu,)) for n, pu in first_pus.items()]
    warned: list[str] = []

    def differ(p: VMPlan) -> list[str]:
        return abi_differences(saved, guest_abi(p, boot))

    restored, found = plan_same_guest(request, differ, host=host, warn=warned.append, taken=held)
    assert found == []  # the same guest, always
    beside = plan(host, request, held)
    if not differ(beside):
        assert restored == beside and not warned  # beside the live VMs where it can be
    else:
        assert restored.vcpu_pus() == plan(host, request).vcpu_pus()
        assert len(warned) == 1 and "your running VMs hold too" in warned[0]
