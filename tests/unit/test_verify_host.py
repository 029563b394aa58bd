"""verify's host-side parsers and checks on text captured from a real VM on this machine.

The data (tests/unit/data/verify/libvirt-numa2, see its README) is /proc of a libvirt
QEMU running a 2-node numa plan with 2M huge pages. Expected numbers come from the plan
file and from the raw text itself (counted here with plain string operations), never
from the code under test. The failing cases change one real value (a thread's affinity,
a node count in numa_maps, the plan) to show each check notices exactly that change.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpcvm.plan.model import VMPlan
from hpcvm.runtime.verify import observe
from hpcvm.runtime.verify import vm as verify
from hpcvm.runtime.verify.vm import Observed

DATA = Path(__file__).parent / "data" / "verify" / "libvirt-numa2"


def _plan() -> VMPlan:
    return VMPlan.model_validate_json((DATA / "plan.json").read_text())


def _threads(overrides: dict[int, str] | None = None) -> tuple[observe.ThreadInfo, ...]:
    out = []
    for status in sorted((DATA / "task").glob("*.status")):
        tid = int(status.stem)
        text = status.read_text()
        if overrides and tid in overrides:
            text = re.sub(r"Cpus_allowed_list:\t\S+", f"Cpus_allowed_list:\t{overrides[tid]}", text)
        name = (DATA / "task" / f"{tid}.comm").read_text().strip()
        out.append(observe.ThreadInfo(tid, name, observe.parse_cpus_allowed(text)))
    return tuple(out)


def _vcpu_threads() -> dict[int, int]:
    raw = json.loads((DATA / "vcpu_threads.json").read_text())
    return {int(k): int(v) for k, v in raw.items()}


def _mappings(numa_maps: str | None = None) -> tuple[observe.Mapping, ...]:
    text = numa_maps if numa_maps is not None else (DATA / "numa_maps").read_text()
    sizes = observe.parse_maps_sizes((DATA / "maps").read_text())
    return tuple(observe.with_sizes(observe.parse_numa_maps(text), sizes))


def _observed(**changes: object) -> Observed:
    base = {
        "guest": None,
        "vcpu_threads": _vcpu_threads(),
        "threads": _threads(),
        "mappings": _mappings(),
    }
    base.update(changes)
    return Observed(**base)  # type: ignore[arg-type]


def _huge_lines() -> list[str]:
    return [line for line in (DATA / "numa_maps").read_text().splitlines() if " huge " in line]


# -- parsers ------------------------------------------------------------------------------


def test_cpus_allowed_list_of_each_vcpu_thread_is_its_planned_pu() -> None:
    plan = _plan()
    for vcpu, tid in _vcpu_threads().items():
        text = (DATA / "task" / f"{tid}.status").read_text()
        raw = re.search(r"Cpus_allowed_list:\t(\S+)", text)
        assert raw is not None
        assert observe.parse_cpus_allowed(text) == {int(raw.group(1))}
        assert raw.group(1) == str(plan.placements[vcpu].host_pu)


def test_cpus_allowed_list_ranges_and_missing_line() -> None:
    main = DATA / "task" / f"{min(int(p.stem) for p in (DATA / 'task').glob('*.status'))}.status"
    assert observe.parse_cpus_allowed(main.read_text()) == {0, 1}  # the file says 0-1
    with pytest.raises(ValueError):
        observe.parse_cpus_allowed("Name:\tqemu\n")


def test_numa_maps_huge_mappings_match_the_raw_lines() -> None:
    huge = [m for m in _mappings() if m.huge]
    lines = _huge_lines()
    assert len(huge) == len(lines) == 2
    for m, line in zip(huge, lines, strict=True):
        assert m.start == int(line.split()[0], 16)
        assert m.policy == "bind" and m.policy_nodes == {0}
        assert m.page_size == 2048 * 1024
        assert m.pages == {0: int(re.search(r" N0=(\d+)", line).group(1))}  # type: ignore[union-attr]
        assert "memfd" in m.path


def test_maps_sizes_give_each_guest_node_its_planned_size() -> None:
    plan = _plan()
    sizes = sorted(m.size for m in _mappings() if m.huge)
    assert sizes == sorted(n.memory_bytes for n in plan.guest_nodes)


def test_policy_forms() -> None:
    assert observe.parse_policy("default") == ("default", frozenset())
    assert observe.parse_policy("bind:0-2") == ("bind", frozenset({0, 1, 2}))
    assert observe.parse_policy("bind=static:1,3") == ("bind", frozenset({1, 3}))
    assert observe.parse_policy("interleave:0-1") == ("interleave", frozenset({0, 1}))


def test_huge_pages_by_node_counts_this_process_only() -> None:
    plan = _plan()
    used = observe.huge_pages_by_node(_mappings(), plan.page_size_bytes)
    assert used == plan.hugepages_needed
    assert observe.huge_pages_by_node(_mappings(), 1024**3) == {}


# -- checks on the real data: all pass ---------------------------------------------------


@pytest.mark.parametrize(
    "check",
    [verify.check_vcpu_pins, verify.check_hugepages, verify.check_memory_placement],
)
def test_host_checks_pass_on_the_captured_vm(check: verify.CheckFn) -> None:
    results = check(_plan(), _observed())
    assert results, "a check with nothing to check would prove nothing"
    assert all(c.ok for c in results), results


def test_guest_checks_fail_when_the_guest_could_not_be_read() -> None:
    results = verify.run_checks(_plan(), _observed(guest_error="agent timed out"))
    bad = [c for c in results if not c.ok]
    assert [c.name for c in bad] == ["guest readable"]
    assert bad[0].detail == "agent timed out"


# -- checks on altered data: each notices exactly its change ------------------------------


def test_swapped_vcpu_affinities_are_reported_for_both_vcpus() -> None:
    tids = _vcpu_threads()
    plan = _plan()
    swapped = {tids[0]: str(plan.placements[1].host_pu), tids[1]: str(plan.placements[0].host_pu)}
    results = verify.check_vcpu_pins(plan, _observed(threads=_threads(swapped)))
    assert [c.ok for c in results] == [False, False]
    assert [c.actual for c in results] == [swapped[tids[0]], swapped[tids[1]]]


def test_unpinned_vcpu_thread_is_a_mismatch() -> None:
    tids = _vcpu_threads()
    results = verify.check_vcpu_pins(_plan(), _observed(threads=_threads({tids[1]: "0-1"})))
    assert [c.ok for c in results] == [True, False]
    assert results[1].actual == "0-1"


def test_emulator_threads_off_their_pus_are_named() -> None:
    # The captured VM left QEMU's own threads free (0-1); a plan that wanted them on PU 0
    # must fail and name them.
    plan = _plan().model_copy(update={"emulator_pus": (0,)})
    (result,) = verify.check_emulator_pins(plan, _observed())
    assert not result.ok
    others = len(list((DATA / "task").glob("*.status"))) - len(_vcpu_threads())
    assert result.detail.startswith(f"{others} of {others} threads off: qemu-system-x86")
    ok_plan = _plan().model_copy(update={"emulator_pus": (0, 1)})
    assert verify.check_emulator_pins(ok_plan, _observed())[0].ok


def test_pages_on_a_foreign_node_break_placement_and_node_counts() -> None:
    text = (DATA / "numa_maps").read_text()
    line = _huge_lines()[0]
    moved = line.replace(" N0=128 ", " N0=120 N1=8 ")
    assert moved != line
    mappings = _mappings(text.replace(line, moved))
    placement = verify.check_memory_placement(_plan(), _observed(mappings=mappings))
    assert [c.ok for c in placement] == [False]
    assert "node 1: 16M" in placement[0].actual
    pages = verify.check_hugepages(_plan(), _observed(mappings=mappings))
    assert {c.name: c.ok for c in pages} == {
        "huge pages (2M) on host node 0": False,
        "huge pages (2M) on host node 1": False,
    }


def test_a_missing_backend_mapping_is_reported() -> None:
    text = (DATA / "numa_maps").read_text().replace(_huge_lines()[1] + "\n", "")
    placement = verify.check_memory_placement(_plan(), _observed(mappings=_mappings(text)))
    assert not placement[0].ok
    assert placement[0].actual.startswith("256M mapped")


def test_plan_asking_more_pages_than_qemu_holds() -> None:
    plan = _plan().model_copy(update={"hugepages_needed": {0: 300}})
    (result,) = verify.check_hugepages(plan, _observed())
    assert (result.expected, result.actual, result.ok) == ("300", "256", False)
