"""verify's guest-side parsing and checks on output captured in real guests here.

tests/unit/data/verify/guest holds what ``guest_sysfs.SCRIPT`` printed in built-in guests
on this machine, beside the plans they ran (see its README). Expected values are read
from the raw text with plain string operations or from the plan file, never from the
parser under test. Failing cases change the plan (what the VM was supposed to be) or
use the real SMT capture, where QEMU's CPU model hid the planned threads from the guest.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcvm.plan.model import CpuTopology, VMPlan
from hpcvm.runtime.verify import guest_sysfs
from hpcvm.runtime.verify import vm as verify
from hpcvm.runtime.verify.vm import Observed
from hpcvm.units import KIB, MIB

DATA = Path(__file__).parent / "data" / "verify" / "guest"
CASES = ("numa2-2vcpu-512M", "flat-2vcpu-512M")
GUEST_CHECKS = (
    verify.check_cpu_count,
    verify.check_topology,
    verify.check_numa_nodes,
    verify.check_node_cpus,
    verify.check_node_memory,
    verify.check_distances,
    verify.check_clock,
)


def _text(case: str) -> str:
    return (DATA / f"{case}.txt").read_text()


def _plan(case: str) -> VMPlan:
    return VMPlan.model_validate_json((DATA / f"{case}.plan.json").read_text())


def _seen(case: str) -> Observed:
    return Observed(guest=guest_sysfs.parse_facts(_text(case)))


def _guest_checks(plan: VMPlan, seen: Observed) -> list[verify.Check]:
    return [c for fn in GUEST_CHECKS for c in fn(plan, seen)]


def _raw_file(case: str, path: str) -> str:
    match = re.search(rf"==> {re.escape(path)} <==\n(.*?)(?:\n\n|\Z)", _text(case), re.S)
    assert match, path
    return match.group(1).strip()


# -- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_facts_match_the_raw_files(case: str) -> None:
    facts = guest_sysfs.parse_facts(_text(case))
    nodes = sorted(int(n) for n in re.findall(r"/node/node(\d+)/cpulist <==", _text(case)))
    assert sorted(facts.nodes) == nodes
    for n in nodes:
        mem = re.search(rf"Node {n} MemTotal:\s+(\d+) kB", _text(case))
        assert mem is not None
        assert facts.nodes[n].mem_total_bytes == int(mem.group(1)) * KIB
        assert facts.nodes[n].distances == tuple(
            int(d) for d in _raw_file(case, f"/sys/devices/system/node/node{n}/distance").split()
        )
    nproc = re.search(r"^nproc=(\d+)$", _text(case), re.M)
    assert nproc is not None and facts.nproc == int(nproc.group(1))
    assert facts.clocksource == _raw_file(
        case, "/sys/devices/system/clocksource/clocksource0/current_clocksource"
    )
    assert len(facts.cpus) == len(re.findall(r"/topology/core_id <==", _text(case)))


def test_files_missing_from_the_dump_leave_fields_empty() -> None:
    text = re.sub(
        r"==> /sys/devices/system/node/node1/meminfo <==\n.*?\n\n", "", _text(CASES[0]), flags=re.S
    )
    facts = guest_sysfs.parse_facts(text)
    assert facts.nodes[1].mem_total_bytes is None
    assert facts.nodes[0].mem_total_bytes is not None
    assert guest_sysfs.parse_facts("").online == ()


def test_mem_total_line_format() -> None:
    assert guest_sysfs.parse_mem_total("Node 3 MemTotal:  1024 kB\nNode 3 MemFree: 5 kB") == (
        1024 * KIB
    )
    assert guest_sysfs.parse_mem_total("Node 3 MemFree: 5 kB") is None


# -- checks: the captured guests match their plans ----------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_captured_guests_pass_every_guest_check(case: str) -> None:
    results = _guest_checks(_plan(case), _seen(case))
    names = {c.name for c in results}
    assert {"online CPUs", "CPU topology", "NUMA nodes", "clocksource"} <= names
    assert all(c.ok for c in results), [c for c in results if not c.ok]


def test_numa_capture_checks_every_node() -> None:
    plan = _plan(CASES[0])
    names = {c.name for c in _guest_checks(plan, _seen(CASES[0]))}
    for node in plan.guest_nodes:
        assert {f"node {node.index} CPUs", f"node {node.index} memory"} <= names
        assert f"node {node.index} distances" in names


# -- checks: a VM that is not what the plan says -------------------------------------------


def test_record_claiming_three_vcpus_is_a_cpu_count_mismatch() -> None:
    plan = _plan(CASES[0]).model_copy(update={"vcpus": 3})
    bad = [c for c in _guest_checks(plan, _seen(CASES[0])) if not c.ok]
    assert [(c.name, c.expected, c.actual) for c in bad] == [("online CPUs", "3", "2")]


def test_hidden_smt_threads_fail_the_topology_check() -> None:
    case = "smt2-2vcpu-512M"
    plan = _plan(case)
    assert plan.topology == CpuTopology(sockets=1, cores=1, threads=2)
    bad = [c for c in _guest_checks(plan, _seen(case)) if not c.ok]
    assert [c.name for c in bad] == ["CPU topology"]
    assert bad[0].actual == "1 sockets, 1 dies, 2 cores, 1 threads"


def test_node_memory_beyond_the_kernels_share_fails() -> None:
    case = CASES[0]
    plan = _plan(case)
    bigger = tuple(
        n.model_copy(update={"memory_bytes": n.memory_bytes + 128 * MIB}) for n in plan.guest_nodes
    )
    plan = plan.model_copy(update={"guest_nodes": bigger, "memory_bytes": plan.memory_bytes})
    bad = {c.name for c in _guest_checks(plan, _seen(case)) if not c.ok}
    assert bad == {f"node {n.index} memory" for n in plan.guest_nodes}


def test_memory_above_the_plan_fails() -> None:
    # A guest can never see more than it was given: less planned than seen is a mismatch.
    plan = _plan("flat-2vcpu-512M").model_copy(update={"memory_bytes": 256 * MIB})
    bad = {c.name for c in _guest_checks(plan, _seen("flat-2vcpu-512M")) if not c.ok}
    assert bad == {"node 0 memory", "guest memory"}


def test_memory_floor_allows_the_measured_kernel_share() -> None:
    # Measured here (verify module doc): 2 x 128 MiB guest, node 1 showed 83,148 kB.
    assert verify.memory_floor(128 * MIB) <= 83_148 * KIB
    assert verify.memory_floor(2048 * MIB) <= 2_014_152 * KIB
    assert verify.memory_floor(2048 * MIB) > 1900 * MIB  # still catches a lost 10%


def test_other_distances_fail_only_the_distance_checks() -> None:
    case = CASES[0]
    plan = _plan(case).model_copy(update={"guest_distances": ((10, 21), (21, 10))})
    bad = [c for c in _guest_checks(plan, _seen(case)) if not c.ok]
    assert [(c.name, c.expected) for c in bad] == [
        ("node 0 distances", "10 21"),
        ("node 1 distances", "21 10"),
    ]


def test_cpus_on_the_wrong_node_fail() -> None:
    case = CASES[0]
    plan = _plan(case)
    swapped = tuple(
        n.model_copy(update={"vcpus": plan.guest_nodes[1 - i].vcpus})
        for i, n in enumerate(plan.guest_nodes)
    )
    bad = [
        c.name
        for c in _guest_checks(plan.model_copy(update={"guest_nodes": swapped}), _seen(case))
        if not c.ok
    ]
    assert bad == ["node 0 CPUs", "node 1 CPUs"]


def test_a_named_clock_must_be_the_guests_clocksource() -> None:
    case = CASES[1]
    seen_clock = _raw_file(case, "/sys/devices/system/clocksource/clocksource0/current_clocksource")
    other = "tsc" if seen_clock != "tsc" else "hpet"
    (bad,) = verify.check_clock(_plan(case).model_copy(update={"clock": other}), _seen(case))
    assert (bad.ok, bad.expected, bad.actual) == (False, other, seen_clock)
    (good,) = verify.check_clock(_plan(case).model_copy(update={"clock": seen_clock}), _seen(case))
    assert good.ok
