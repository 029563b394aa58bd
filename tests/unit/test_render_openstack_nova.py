"""Nova itself judges every flavor hpcvm renders: for each snapshot in
../shared/topologies/, the planner's plans over a matrix of profiles, SMT policies,
vCPUs, memory, guest nodes and page sizes are rendered with the host they were planned
for, and tests/nova/check_flavor.py (Nova 34's own code, in .venv-nova: see
scripts/setup-nova.sh) answers whether the flavor validates, what Nova makes of it
(numa_get_constraints, the placement request, the guest topology) and whether
numa_fit_instance_to_host fits it onto that machine, built from hwloc's XML (not from
hpcvm's host model) with the output's cpu_dedicated_set / cpu_shared_set and the huge
pages the test reserved. Every flavor must fit, and Nova's view must be the plan's;
pinned flavors must also fit the same machine with every non-housekeeping PU dedicated.
Refusals must be one line and only for plans that hwloc's view shows Nova cannot hold.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from hpcvm.errors import HpcvmError, InfeasiblePlanError
from hpcvm.host import HostTopology
from hpcvm.host.model import HugePagePool
from hpcvm.plan import plan as make_plan
from hpcvm.plan.model import PlanRequest, ProfileName, SmtPolicy, VMPlan
from hpcvm.render.openstack import ComputeHost, FlavorRender, openstack_flavor
from hpcvm.units import GIB, KIB, MIB
from tests.conftest import REPO, SNAPSHOT_IDS, TOPOLOGIES, Snapshot
from tests.nova.host_view import HwlocMachine, lstopo_xml, machine, nova_host
from tests.plan_checks import host_from

NOVA_PYTHON = REPO / ".venv-nova" / "bin" / "python"
CHECKER = REPO / "tests" / "nova" / "check_flavor.py"

pytestmark = pytest.mark.skipif(
    not NOVA_PYTHON.exists(),
    reason="Nova's oracle is missing: run scripts/setup-nova.sh (creates .venv-nova)",
)

#: (vCPUs, memory): one and many vCPUs, small and large guests, past 8 PUs per node,
#: and an odd count whose memory splits unevenly over guest nodes (whole MiB for Nova).
SIZES = ((1, GIB), (2, 4 * GIB), (3, GIB), (4, GIB), (8, 4 * GIB), (16, GIB), (16, 8 * GIB))
PINNED: tuple[ProfileName, ...] = ("pinned", "hugepages", "numa", "hpc")
POLICIES: tuple[SmtPolicy, ...] = ("cores", "pack", "require")


class Checker:
    """One Nova process for the session, one JSON line per batch each way."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [str(NOVA_PYTHON), str(CHECKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={"PYTHONWARNINGS": "ignore", "PATH": "/usr/bin:/bin"},
        )

    def ask(self, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cases": cases}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"check_flavor.py ended (exit {self.proc.poll()})"
        answers: list[dict[str, Any]] = json.loads(line)
        return answers


@pytest.fixture(scope="module")
def nova() -> Iterator[Checker]:
    checker = Checker()
    yield checker
    assert checker.proc.stdin is not None
    checker.proc.stdin.close()
    checker.proc.wait(timeout=60)


def reserved(host: HostTopology) -> HostTopology:
    """A copy of the host with a quarter of each normal node's memory in free 2M pages
    and a quarter in free 1G pages (the snapshots' pools are empty). INVENTED counts,
    the same ones the Nova host gets; CPUs and memory are the machine's."""
    nodes = []
    for node in host.nodes:
        pools = []
        if node.kind == "normal":
            quarter = node.memory_bytes // 4
            pools = [
                HugePagePool(
                    size_bytes=2 * MIB, total=quarter // (2 * MIB), free=quarter // (2 * MIB)
                ),
                HugePagePool(size_bytes=GIB, total=quarter // GIB, free=quarter // GIB),
            ]
        update = {"hugepages": tuple(p for p in pools if p.total), "available_bytes": None}
        nodes.append(node.model_copy(update=update))
    return host.model_copy(update={"nodes": tuple(nodes)})


def requests() -> Iterator[PlanRequest]:
    for vcpus, memory in SIZES:
        yield PlanRequest(name="n", profile="naive", vcpus=vcpus, memory_bytes=memory, accel="tcg")
        for profile in PINNED:
            shapes: list[tuple[int | None, int | None]] = [(None, None)]
            if profile in ("numa", "hpc"):
                shapes += [(None, 2), (4 * KIB, None), (GIB, None)]
            for smt in POLICIES:
                for page, nodes in shapes:
                    yield PlanRequest(
                        name=f"n-{profile}",
                        profile=profile,
                        vcpus=vcpus,
                        memory_bytes=memory,
                        page_size_bytes=page,
                        guest_nodes=nodes,
                        smt=smt,
                        accel="auto",
                    )


@functools.cache
def hwloc_view(snap: Snapshot) -> HwlocMachine:
    if snap.kind == "sysfs":
        return machine(lstopo_xml(fsroot=snap.path))
    return machine(lstopo_xml(xml=snap.path))


def pools_of(host: HostTopology) -> dict[int, dict[int, int]]:
    return {n.os_index: {p.size_bytes: p.total for p in n.hugepages} for n in host.nodes}


def nova_cannot_hold(
    plan: VMPlan, hw: HwlocMachine, pools: dict[int, dict[int, int]]
) -> str | None:
    """Why Nova, by its documented rules, has no host for this plan on this machine
    (hwloc's nodes and memory, the test's pools): guest nodes sharing a host node, or a
    flat dedicated/page-sized guest whose vCPUs or huge pages lie on more than one
    node, or whose memory that one node cannot hold."""
    hosts = [n.host_node for n in plan.guest_nodes]
    if len(set(hosts)) < len(hosts):
        return "stacked"
    if plan.guest_nodes or not (plan.pinned or plan.page_size_bytes != 4 * KIB):
        return None
    nodes = {hw.node_of(pu) for pu in plan.vcpu_pus()} | set(plan.hugepages_needed)
    if len(nodes) > 1 or None in nodes:
        return "spread"
    (node,) = nodes
    assert node is not None
    pool = pools.get(node, {})
    if plan.page_size_bytes != 4 * KIB:
        short = pool.get(plan.page_size_bytes, 0) * plan.page_size_bytes < plan.memory_bytes
    else:
        small = hw.nodes[node][1] - sum(size * count for size, count in pool.items())
        short = small < plan.memory_bytes
    return "memory" if short else None


def check_answer(
    plan: VMPlan, render: FlavorRender, hw: HwlocMachine, answer: dict[str, Any]
) -> None:
    """Nova validates, fits and means the plan."""
    assert answer["errors"] == [], answer["errors"]
    assert "error" not in answer, answer["error"]
    t = plan.topology
    assert answer["topology"] == [t.sockets * t.dies, t.cores, t.threads]
    assert answer["resources"].get("MEMORY_MB") == plan.memory_bytes // MIB
    if not plan.pinned and not plan.guest_nodes and plan.page_size_bytes == 4 * KIB:
        assert answer["constraints"] is None and answer["resources"].get("VCPU") == plan.vcpus
        return
    _check_cells(plan, answer["constraints"])
    _check_placement(plan, render, hw, answer)
    fit = answer["fit"]
    assert fit is not None, "numa_fit_instance_to_host found no host cells: NoValidHost"
    assert len({c["host_cell"] for c in fit["cells"]}) == len(fit["cells"])
    assert {c["pagesize"] for c in fit["cells"]} == {plan.page_size_bytes // KIB}
    if plan.pinned:
        _check_pins(plan, render, hw, fit)


def _check_cells(plan: VMPlan, constraints: dict[str, Any]) -> None:
    cells = constraints["cells"]
    if plan.guest_nodes:
        expected = [(sorted(n.vcpus), n.memory_bytes // MIB) for n in plan.guest_nodes]
    else:
        expected = [(list(range(plan.vcpus)), plan.memory_bytes // MIB)]
    assert [(c["cpus"], c["memory"]) for c in cells] == expected
    small = plan.page_size_bytes == 4 * KIB  # hw:mem_page_size=small: Nova's -1
    assert {c["pagesize"] for c in cells} == {-1 if small else plan.page_size_bytes // KIB}
    assert {c["cpu_policy"] for c in cells} == {"dedicated" if plan.pinned else None}
    emulator = constraints["emulator_threads_policy"]
    assert emulator == ("share" if plan.emulator_pus else None)


def _check_placement(
    plan: VMPlan, render: FlavorRender, hw: HwlocMachine, answer: dict[str, Any]
) -> None:
    """Placement: PCPUs for the vCPUs only (emulator threads share), never a trait the
    machine cannot offer (HW_CPU_HYPERTHREADING forbidden on an SMT host, or required
    on one without)."""
    if plan.pinned:
        assert answer["resources"].get("PCPU") == plan.vcpus
        assert render.compute is not None
        assert len(render.compute.dedicated) >= plan.vcpus
    trait = "HW_CPU_HYPERTHREADING"
    assert trait not in (answer["forbidden"] if hw.smt else answer["required"])


def _check_pins(plan: VMPlan, render: FlavorRender, hw: HwlocMachine, fit: dict[str, Any]) -> None:
    """Nova's pins use host cores as the plan's do: the same number of vCPUs on each
    core (one per core stays one per core, guest threads stay siblings), unless the
    output says Nova shares cores more than planned; housekeeping is never dedicated."""
    assert render.compute is not None
    dedicated, shared = set(render.compute.dedicated), set(render.compute.shared)
    assert not dedicated & set(plan.housekeeping_pus) and shared == set(plan.housekeeping_pus)
    pins = [pu for cell in fit["cells"] for pu in cell["pinning"].values()]
    assert len(pins) == plan.vcpus and set(pins) <= dedicated
    nova_loads = sorted(Counter(hw.core_of(pu) for pu in pins).values())
    plan_loads = sorted(Counter(hw.core_of(pu) for pu in plan.vcpu_pus()).values())
    if nova_loads != plan_loads:
        assert any("share cores more than planned" in n for n in render.notes), (
            f"Nova puts {nova_loads} vCPUs per core, the plan {plan_loads}"
        )
        assert len(nova_loads) < len(plan_loads)


@functools.cache
def _cases(
    snap: Snapshot,
) -> tuple[list[tuple[VMPlan, FlavorRender, dict[str, Any]]], Counter[str]]:
    """The matrix planned and rendered on one snapshot, with its tally: once per process
    (the per-snapshot test and the coverage test below read the same cases; neither
    changes them)."""
    hw = hwloc_view(snap)
    host = reserved(host_from(snap.kind, str(snap.path)))
    out: list[tuple[VMPlan, FlavorRender, dict[str, Any]]] = []
    tally: Counter[str] = Counter()
    for request in requests():
        try:
            plan = make_plan(host, request)
        except HpcvmError:
            tally["planner refused"] += 1
            continue
        why = nova_cannot_hold(plan, hw, pools_of(host))
        try:
            render = openstack_flavor(plan, host)
        except InfeasiblePlanError as err:
            assert "\n" not in str(err) and why is not None, f"{request}: {err}"
            tally[f"refused ({why})"] += 1
            continue
        assert why is None, f"{request}: rendered although Nova cannot hold it ({why})"
        compute = render.compute
        dedicated = compute.dedicated if compute else ()
        shared = compute.shared if compute else ()
        case = {"flavor": render.flavor, "host": nova_host(hw, pools_of(host), dedicated, shared)}
        out.append((plan, render, case))
        tally["rendered"] += 1
    return out, tally


def _short(request: PlanRequest) -> str:
    fields = ("profile", "vcpus", "memory_bytes", "page_size_bytes", "guest_nodes", "smt")
    return " ".join(f"{k}={getattr(request, k)}" for k in fields)


@pytest.mark.parametrize("snapshot", SNAPSHOT_IDS, indirect=True)
def test_nova_schedules_every_flavor_as_planned(snapshot: Snapshot, nova: Checker) -> None:
    cases, tally = _cases(snapshot)
    if not cases:
        pytest.skip(f"no flavor to check on {snapshot.name}: {dict(tally)}")
    answers = nova.ask([case for _, _, case in cases])
    failures = []
    for (plan, render, _), answer in zip(cases, answers, strict=True):
        try:
            check_answer(plan, render, hwloc_view(snapshot), answer)
        except AssertionError as err:
            failures.append(f"{_short(plan.request)}: {str(err).splitlines()[0]}")
    assert not failures, f"{len(failures)} of {len(cases)} flavors: " + "\n".join(failures[:8])
    _check_whole_host(snapshot, [(plan, case) for plan, _, case in cases if plan.pinned], nova)


def _check_whole_host(
    snap: Snapshot, cases: list[tuple[VMPlan, dict[str, Any]]], nova: Checker
) -> None:
    """Each flavor also fits a host of this machine whose cpu_dedicated_set is simply
    every usable PU but the housekeeping ones (an operator who did not narrow it): it
    is schedulable there too, only Nova may pack vCPUs onto siblings."""
    every = set().union(*hwloc_view(snap).cores)
    wide = []
    for plan, case in cases:
        housekeeping = set(plan.housekeeping_pus)
        host = {**case["host"], "dedicated": sorted(every - housekeeping)}
        wide.append({**case, "host": host})
    answers = nova.ask(wide)
    unfit = [_short(p.request) for (p, _), a in zip(cases, answers, strict=True) if not a["fit"]]
    assert not unfit, f"{len(unfit)} flavors fit no host with every PU dedicated: {unfit[:5]}"


def test_the_nova_checks_can_fail(nova: Checker) -> None:
    """The defects of issue 15, put back by hand into flavors rendered for a real SMT
    machine (2 nodes x 6 cores x 2 threads), are caught by Nova's answers: isolate on
    an SMT host (never scheduled), three guest nodes on two host nodes, a guest told one
    thread per core while Nova packs siblings, and a dedicated set with siblings where
    the plan wants one vCPU per core."""
    snap = Snapshot("24em64t-2n6c2t-pci", "xml", TOPOLOGIES / "xml" / "24em64t-2n6c2t-pci.xml")
    hw, host = hwloc_view(snap), reserved(host_from(snap.kind, str(snap.path)))
    request = PlanRequest(name="f", profile="numa", vcpus=6, memory_bytes=3 * GIB)
    plan = make_plan(host, request)
    render = openstack_flavor(plan, host)
    assert render.compute is not None and len(plan.guest_nodes) == 1
    specs = render.extra_specs
    three = {"hw:numa_nodes": "3"} | {
        f"hw:numa_{k}.{n}": v
        for n in range(3)
        for k, v in (("cpus", f"{2 * n},{2 * n + 1}"), ("mem", "1024"))
    }
    every_thread = tuple(sorted(set().union(*hw.cores)))
    broken = [  # (extra specs, cpu_dedicated_set, what Nova's answer shows)
        ({**specs, "hw:cpu_thread_policy": "isolate"}, render.compute.dedicated, "HYPERTHREADING"),
        ({**specs, **three}, render.compute.dedicated, "0, 1"),
        ({**specs, "hw:cpu_thread_policy": "require"}, every_thread, "vCPUs per core"),
        (specs, every_thread, "vCPUs per core"),
    ]
    answers = nova.ask([_case(render, bad, dedicated, hw, host) for bad, dedicated, _ in broken])
    for (bad, dedicated, why), answer in zip(broken, answers, strict=True):
        compute = ComputeHost(dedicated=dedicated, shared=render.compute.shared)
        wrong = FlavorRender(render.flavor | {"extra_specs": bad}, render.notes, compute)
        with pytest.raises(AssertionError, match=why):
            check_answer(plan, wrong, hw, answer)
    (answer,) = nova.ask([_case(render, specs, render.compute.dedicated, hw, host)])
    check_answer(plan, render, hw, answer)


def _case(
    render: FlavorRender,
    specs: dict[str, str],
    dedicated: tuple[int, ...],
    hw: HwlocMachine,
    host: HostTopology,
) -> dict[str, Any]:
    shared = render.compute.shared if render.compute else ()
    flavor = {**render.flavor, "extra_specs": specs}
    return {"flavor": flavor, "host": nova_host(hw, pools_of(host), dedicated, shared)}


def test_the_matrix_reaches_every_case_of_the_issue(all_snapshots: list[Snapshot]) -> None:
    """The matrix is not vacuous: across the snapshots it renders every thread policy,
    multi-node guests, 1G pages and shared emulator threads, and meets both refusals
    (guest nodes stacked on a host node, flat guests over host nodes)."""
    rendered: list[FlavorRender] = []
    tally: Counter[str] = Counter()
    for snap in all_snapshots:
        cases, counts = _cases(snap)
        rendered += [render for _, render, _ in cases]
        tally.update(counts)
    specs = [r.extra_specs for r in rendered]
    assert {s.get("hw:cpu_thread_policy") for s in specs} >= {"isolate", "prefer", "require"}
    assert any(int(s.get("hw:numa_nodes", "1")) > 1 for s in specs)
    assert any(s.get("hw:mem_page_size") == "1GB" for s in specs)
    assert any(s.get("hw:emulator_threads_policy") == "share" for s in specs)
    assert tally["refused (stacked)"] and tally["refused (spread)"], dict(tally)
