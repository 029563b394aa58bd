"""OpenStack flavors of the planner's plans on every real machine snapshot.

Each plan's flavor is checked against the plan itself (never against the renderer's own
helpers): vCPUs and RAM, the guest topology, the guest NUMA nodes' exact vCPU/memory
partition, the page size, which profiles pin, how SMT is used and what the compute
host's nova.conf must say, and that the pins and host nodes Nova cannot take reappear
in the notes. Plans no schedulable flavor can express are refused in one line.
(Whether Nova itself schedules each flavor: test_render_openstack_nova.py.) The command
lines are run through a real bash with an ``openstack`` shell function that records its
arguments, so the quoting is checked by the shell that will run it.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hpcvm.errors import HpcvmError, InfeasiblePlanError, UsageError
from hpcvm.host import HostTopology
from hpcvm.host.model import PciDevice
from hpcvm.plan import plan as make_plan
from hpcvm.plan.model import PROFILE_NAMES, PlanRequest, ProfileName, VMPlan
from hpcvm.render.openstack import FlavorRender, openstack_flavor, openstack_flavor_commands
from hpcvm.units import GIB, KIB, MIB, parse_cpu_list
from tests import render_plans as hand
from tests.conftest import TOPOLOGIES, Snapshot, sysfs_root
from tests.nova.host_view import lstopo_xml, machine
from tests.plan_checks import host_from, roomy
from tests.render_plans import plans_for, with_free_hugepages

# Every extra spec name this renderer may use, as listed in Nova's extra spec reference
# (nova/api/validation/extra_specs/hw.py and pci_passthrough.py); N is a guest node.
NOVA_SPECS = re.compile(
    r"^(hw:(cpu_sockets|cpu_cores|cpu_threads|cpu_policy|cpu_thread_policy|"
    r"emulator_threads_policy|mem_page_size|locked_memory|numa_nodes|numa_cpus\.\d+|"
    r"numa_mem\.\d+|pci_numa_affinity_policy)|pci_passthrough:alias)$"
)
PINNING_SPECS = ("hw:cpu_policy", "hw:cpu_thread_policy", "hw:emulator_threads_policy")
STACKED = ("r-numa", "r-numa-4k")  # hand-built: two guest nodes on host node 0
_NOVA_UNITS = {"KB": KIB, "MB": MIB, "GB": GIB}


@functools.cache
def snapshot_host(snap: Snapshot) -> HostTopology:
    return host_from(snap.kind, str(snap.path))


@functools.cache
def cloud_plans(snap: Snapshot) -> tuple[VMPlan, ...]:
    """The plans of ``cloud_cases`` (the KubeVirt tests use them too)."""
    return tuple(plan for _, plan in cloud_cases(snap))


@functools.cache
def cloud_cases(snap: Snapshot) -> tuple[tuple[HostTopology, VMPlan], ...]:
    """The planner's plans for the snapshot with free 2M pages (all shapes, TCG and
    KVM), and on a roomy copy (free 2M and 1G pages) numa/hpc plans on 1G pages, each
    with the host copy it was planned on."""
    host = snapshot_host(snap)
    pooled = with_free_hugepages(host)
    plans = [(pooled, p) for p in plans_for(pooled, "t")]
    for profile in ("numa", "hpc"):
        for vcpus in (8, 4, 2, 1):
            request = PlanRequest(
                name=f"t-{profile}-1g",
                profile=profile,
                vcpus=vcpus,
                memory_bytes=2 * GIB,
                page_size_bytes=GIB,
                accel="kvm" if profile == "hpc" else "tcg",
            )
            try:
                plans.append((roomy(host), make_plan(roomy(host), request)))
                break
            except HpcvmError:
                continue
    return tuple(plans)


def nova_page_bytes(value: str) -> int:
    """hw:mem_page_size read as Nova reads it: digits are KiB, KB/MB/GB are binary."""
    if value.isdigit():
        return int(value) * KIB
    match = re.fullmatch(r"(\d+)(KB|MB|GB)", value)
    assert match, f"hw:mem_page_size {value!r} is not a size"
    return int(match[1]) * _NOVA_UNITS[match[2]]


def check_flavor(plan: VMPlan, render: FlavorRender, host: HostTopology | None = None) -> None:
    """The flavor asks Nova for exactly the plan's guest; with ``host``, the compute
    side is the one that gives it."""
    flavor, specs = render.flavor, render.extra_specs
    assert flavor["name"] == plan.name
    assert flavor["vcpus"] == plan.vcpus
    assert flavor["ram"] * MIB == plan.memory_bytes
    assert flavor["disk"] == 0
    assert all(NOVA_SPECS.match(k) and isinstance(v, str) for k, v in specs.items()), specs
    _check_topology(plan, specs)
    _check_numa(plan, specs)
    _check_pages(plan, specs)
    _check_pinning(plan, specs, render.notes)
    if host is not None and plan.pinned:
        _check_compute(plan, render, host)


def _check_topology(plan: VMPlan, specs: dict[str, str]) -> None:
    t = plan.topology
    shape = [int(specs[f"hw:cpu_{k}"]) for k in ("sockets", "cores", "threads")]
    assert shape == [t.sockets * t.dies, t.cores, t.threads]
    assert shape[0] * shape[1] * shape[2] == plan.vcpus


def _check_numa(plan: VMPlan, specs: dict[str, str]) -> None:
    """hw:numa_cpus.N / hw:numa_mem.N partition the vCPUs and RAM as the guest nodes."""
    numbered = {k for k in specs if k.startswith(("hw:numa_cpus.", "hw:numa_mem."))}
    if not plan.guest_nodes:
        assert "hw:numa_nodes" not in specs and not numbered
        return
    assert specs.get("hw:numa_nodes") == str(len(plan.guest_nodes))
    expected = {f"hw:numa_{k}.{n.index}" for n in plan.guest_nodes for k in ("cpus", "mem")}
    assert numbered == expected
    seen: list[int] = []
    for node in plan.guest_nodes:
        cpus = parse_cpu_list(specs[f"hw:numa_cpus.{node.index}"])
        assert cpus == sorted(node.vcpus)
        assert int(specs[f"hw:numa_mem.{node.index}"]) * MIB == node.memory_bytes
        seen += cpus
    assert sorted(seen) == list(range(plan.vcpus)), "every vCPU in exactly one node"
    total = sum(int(specs[f"hw:numa_mem.{n.index}"]) for n in plan.guest_nodes)
    assert total * MIB == plan.memory_bytes


def _check_pages(plan: VMPlan, specs: dict[str, str]) -> None:
    huge = {r.page_size_bytes for r in plan.memory if r.backend == "file"}
    page = specs.get("hw:mem_page_size")
    if huge:
        assert page is not None and {nova_page_bytes(page)} == huge
    elif plan.profile == "naive":
        assert page is None, "naive keeps Nova's (and QEMU's) defaults"
    else:
        assert page == "small"


def _check_pinning(plan: VMPlan, specs: dict[str, str], notes: tuple[str, ...]) -> None:
    pinned = any(p.host_pu is not None for p in plan.placements)
    assert pinned == (plan.profile != "naive")
    assert (specs.get("hw:cpu_policy") == "dedicated") == pinned
    if not pinned:
        assert not any(k in specs for k in PINNING_SPECS), specs
        return
    policy = specs["hw:cpu_thread_policy"]
    if plan.topology.threads > 1:
        assert policy == "require"
    else:
        assert policy in ("isolate", "prefer")  # which one: _check_compute
    hpc = plan.profile == "hpc"
    assert (specs.get("hw:emulator_threads_policy") == "share") == hpc
    assert ("hw:emulator_threads_policy" in specs) == hpc
    assert (specs.get("hw:locked_memory") == "true") == (hpc and plan.accel == "kvm")
    # what Nova cannot take is said: the pins, and each guest node's host node
    pus = ",".join(str(p.host_pu) for p in plan.placements)
    assert any(f"host PU{'s' if plan.vcpus > 1 else ''} {pus}" in n for n in notes), notes
    for node in plan.guest_nodes:
        assert any(f"guest node {node.index} -> host node {node.host_node}" in n for n in notes)


def _check_compute(plan: VMPlan, render: FlavorRender, host: HostTopology) -> None:
    """cpu_dedicated_set: usable PUs only, no housekeeping core; one thread per core
    when the plan gives each vCPU a core of its own on an SMT host (then ``prefer``:
    ``isolate`` only on a host without SMT); cpu_shared_set: the housekeeping PUs."""
    assert render.compute is not None
    dedicated = set(render.compute.dedicated)
    usable = {p.os_index for p in host.pus if p.online and p.allowed}
    assert dedicated <= usable and len(dedicated) >= plan.vcpus
    assert set(render.compute.shared) == set(plan.housekeeping_pus)
    housekeeping_cores = {p.core for p in host.pus if p.os_index in plan.housekeeping_pus}
    core_of = {p.os_index: p.core for p in host.pus}
    assert not {core_of[pu] for pu in dedicated} & housekeeping_cores
    smt_host = any(len(c.pus) > 1 for c in host.cores)
    per_core = Counter(core_of[pu] for pu in plan.vcpu_pus())
    policy = render.extra_specs["hw:cpu_thread_policy"]
    if set(per_core.values()) == {1}:
        assert policy == ("prefer" if smt_host else "isolate")
        if smt_host:
            assert max(Counter(core_of[pu] for pu in dedicated).values()) == 1
    else:
        assert policy != "isolate"


def nova_cannot_hold(plan: VMPlan, host: HostTopology) -> bool:
    """Guest nodes sharing a host node, or a flat dedicated/page-sized guest over
    host nodes or short of memory on its one node: Nova's NUMA fitting has no host for
    any of them (Nova itself confirms: test_render_openstack_nova.py)."""
    hosts = [n.host_node for n in plan.guest_nodes]
    if len(set(hosts)) < len(hosts):
        return True
    if plan.guest_nodes or not plan.pinned:
        return False
    node_of = {p.os_index: p.node for p in host.pus}
    nodes = {node_of[pu] for pu in plan.vcpu_pus()} | set(plan.hugepages_needed)
    if len(nodes) > 1 or None in nodes:
        return True
    node = next(n for n in host.nodes if n.os_index in nodes)
    pools = {p.size_bytes: p.total * p.size_bytes for p in node.hugepages}
    if plan.page_size_bytes != 4 * KIB:
        return pools.get(plan.page_size_bytes, 0) < plan.memory_bytes
    return node.memory_bytes - sum(pools.values()) < plan.memory_bytes


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_snapshot_plans_make_the_planned_flavor(snapshot: Snapshot, profile: ProfileName) -> None:
    plans = [(h, p) for h, p in cloud_cases(snapshot) if p.profile == profile]
    if not plans:
        pytest.skip(f"the planner accepts no {profile} request on {snapshot.name}")
    for host, plan in plans:
        if nova_cannot_hold(plan, host):
            with pytest.raises(InfeasiblePlanError) as info:
                openstack_flavor(plan, host)
            assert "\n" not in str(info.value)
            continue
        check_flavor(plan, openstack_flavor(plan, host), host)
        check_flavor(plan, openstack_flavor(plan))  # without the host: no compute side


def test_snapshot_plans_cover_the_shapes_that_matter(all_snapshots: list[Snapshot]) -> None:
    plans = [p for snap in all_snapshots for p in cloud_plans(snap)]
    assert {p.profile for p in plans} == set(PROFILE_NAMES)
    assert any(len(p.guest_nodes) > 1 for p in plans), "no multi-node guest"
    assert any(p.topology.threads > 1 and p.pinned for p in plans), "no SMT guest"
    assert {p.page_size_bytes for p in plans} >= {4 * KIB, 2 * MIB, GIB}
    assert any(p.profile == "hpc" and p.accel == "kvm" for p in plans), "no hpc under KVM"


def spread(plan: VMPlan) -> VMPlan:
    """A hand-built plan with guest node N on host node N (as on a multi-node host)."""
    nodes = tuple(n.model_copy(update={"host_node": n.index}) for n in plan.guest_nodes)
    return plan.model_copy(update={"guest_nodes": nodes})


def hand_plans() -> dict[str, VMPlan]:
    """The hand-built plans, with the stacked guest nodes spread over host nodes."""
    return {k: spread(p) if k in STACKED else p for k, p in hand.all_plans().items()}


@pytest.mark.parametrize("name", sorted(hand.all_plans()))
def test_hand_built_plans_make_the_planned_flavor(name: str) -> None:
    plan = hand_plans()[name]
    check_flavor(plan, openstack_flavor(plan))


@pytest.mark.parametrize("name", STACKED)
def test_stacked_guest_nodes_are_refused(name: str) -> None:
    """Nova fits each guest node into a host node of its own: two guest nodes on host
    node 0 have no schedulable flavor; the refusal says how many guest nodes would."""
    with pytest.raises(InfeasiblePlanError, match="--guest-nodes 1") as info:
        openstack_flavor(hand.all_plans()[name])
    assert "\n" not in str(info.value)


def test_flat_guest_over_host_nodes_is_refused() -> None:
    """A flat huge-page guest whose pages lie on two host nodes: Nova confines it to one."""
    plan = hand.hugepages().model_copy(update={"hugepages_needed": {0: 128, 1: 128}})
    with pytest.raises(InfeasiblePlanError, match="--profile numa") as info:
        openstack_flavor(plan)
    assert "\n" not in str(info.value)


def test_flavor_checks_can_fail() -> None:
    """A plan's flavor checked against a different plan fails: nodes, pages, pins."""
    numa, pinned, hpc = spread(hand.numa()), hand.pinned(), hand.hpc_kvm()
    numa_4k = spread(hand.numa_4k())
    for plan, other in ((numa, pinned), (numa, numa_4k), (pinned, hand.naive())):
        with pytest.raises(AssertionError):
            check_flavor(plan, openstack_flavor(other.model_copy(update={"name": plan.name})))
    swapped = tuple(n.model_copy(update={"vcpus": (1 - n.index,)}) for n in numa.guest_nodes)
    with pytest.raises(AssertionError):
        check_flavor(numa.model_copy(update={"guest_nodes": swapped}), openstack_flavor(numa))
    with pytest.raises(AssertionError):
        check_flavor(hpc, openstack_flavor(hpc.model_copy(update={"profile": "numa"})))


def test_passthrough_is_an_alias_with_its_caveats(snapshots_dir: Path) -> None:
    """hpc with the InfiniBand HCA of 40intel64-2g2n4c+pci. FAKE, on purpose: the
    snapshot records no IOMMU groups and this machine has no VFIO device, so the HCA
    gets IOMMU group 7 with a second function by model_copy; the rest is the real host."""
    hca, second = "0000:43:00.0", "0000:43:00.1"
    host = roomy(host_from("sysfs", str(sysfs_root(snapshots_dir, "40intel64-2g2n4c+pci"))))
    extra = PciDevice(
        bdf=second, kind="other", class_id=0x0207, vendor_id=0x15B3, device_id=0x1003,
        numa_node=2, iommu_group=7,
    )  # fmt: skip
    pci = [d.model_copy(update={"iommu_group": 7}) if d.bdf == hca else d for d in host.pci]
    host = host.model_copy(
        update={"pci": (*pci, extra), "iommu": True, "iommu_groups": {7: (hca, second)}}
    )
    request = PlanRequest(
        name="ib", profile="hpc", vcpus=4, memory_bytes=GIB, passthrough=(hca, second)
    )
    plan = make_plan(host, request)
    render = openstack_flavor(plan)
    check_flavor(plan, render)
    kind = next(d.kind for d in host.pci if d.bdf == hca)
    assert render.extra_specs["pci_passthrough:alias"] == f"hpcvm-{kind}:1,hpcvm-other:1"
    assert render.extra_specs["hw:pci_numa_affinity_policy"] == "required"
    assert any(hca in n and "nova.conf" in n and f"lspci -n -s {hca}" in n for n in render.notes)
    assert any(second in n and "IOMMU group" in n for n in render.notes)
    # a hand-edited plan passing the HCA with a group member it does not pass itself
    alone = plan.model_copy(update={"passthrough": plan.passthrough[:1]})
    assert any(f"{second} get no alias" in n for n in openstack_flavor(alone).notes)


def _run_commands(script: str, tmp_path: Path) -> list[list[str]]:
    """Run the script in bash with ``openstack`` as a function writing each call's
    arguments (NUL-separated, one call per line of the log); return the calls."""
    log = tmp_path / "calls"
    prelude = f"openstack() {{ printf '%s\\0' \"$@\" >> {log}; printf '\\n' >> {log}; }}\n"
    subprocess.run(["bash", "-n", "-c", script], check=True, timeout=60)
    subprocess.run(["bash", "-e", "-c", prelude + script], check=True, timeout=60)
    calls = log.read_bytes().split(b"\0\n")
    return [c.decode().split("\0") for c in calls if c]


@pytest.mark.parametrize("name", sorted(hand.all_plans()))
def test_commands_create_and_set_the_flavor(name: str, tmp_path: Path) -> None:
    plan = hand_plans()[name].model_copy(update={"name": f"job '{name}' $HOME"})
    render = openstack_flavor(plan)
    script = openstack_flavor_commands(plan)
    calls = _run_commands(script, tmp_path)
    create = ["flavor", "create", "--vcpus", str(plan.vcpus), "--ram"]
    assert calls[0] == [*create, str(plan.memory_bytes // MIB), "--disk", "0", plan.name]
    assert len(calls) == 2
    head, props = calls[1][:3], calls[1][3:]
    assert head == ["flavor", "set", plan.name]
    assert props[0::2] == ["--property"] * (len(props) // 2)
    assert dict(p.split("=", 1) for p in props[1::2]) == render.extra_specs
    comments = [line[len("# note: ") :] for line in script.splitlines() if line.startswith("#")]
    assert set(render.notes) <= set(comments)


def test_naive_flavor_says_only_the_guest_shape() -> None:
    """QEMU's defaults are Nova's, except the shape: one socket of N cores (Nova would
    make N sockets), so only the topology is set."""
    specs = openstack_flavor(hand.naive(vcpus=4)).extra_specs
    assert specs == {"hw:cpu_sockets": "1", "hw:cpu_cores": "4", "hw:cpu_threads": "1"}


@pytest.mark.parametrize(
    ("plan", "what"),
    [
        (hand.naive(memory=512 * MIB + 4 * KIB), "not a whole number of MiB"),
        (
            hand.numa().model_copy(
                update={
                    "guest_nodes": tuple(
                        n.model_copy(update={"vcpus": (0, 1) if n.index == 0 else ()})
                        for n in hand.numa().guest_nodes
                    )
                }
            ),
            "guest node 1 has no vCPUs",
        ),
    ],
)
def test_what_nova_cannot_hold_is_a_one_line_usage_error(plan: VMPlan, what: str) -> None:
    with pytest.raises(UsageError, match=what) as info:
        openstack_flavor(plan)
    assert "\n" not in str(info.value)


# --- hpcvm plan --format openstack ------------------------------------------------------

POOLED_XML = "24em64t-2n6c2t-pci"


def pooled_xml(tmp_path: Path) -> Path:
    """A real machine's hwloc XML (2 nodes x 6 cores x 2 threads) with 8192 2M pages
    reserved per node. The pool counts are INVENTED (the export recorded empty pools);
    the CPUs, nodes and memory are the machine's."""
    source = TOPOLOGIES / "xml" / f"{POOLED_XML}.xml"
    empty = '<page_type size="2097152" count="0"/>'
    text = source.read_text()
    assert text.count(empty) == 2, "the export as recorded: two nodes, empty 2M pools"
    out = tmp_path / f"{POOLED_XML}-pools.xml"
    out.write_text(text.replace(empty, '<page_type size="2097152" count="8192"/>'))
    return out


def run_plan(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "plan", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cli_prints_runnable_flavor_commands(tmp_path: Path) -> None:
    xml = pooled_xml(tmp_path)
    result = run_plan(
        "--profile", "numa", "--vcpus", "8", "--memory", "8G", "--topology", xml,
        "--format", "openstack",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    calls = _run_commands(result.stdout, tmp_path)
    assert calls[0] == ["flavor", "create", "--vcpus", "8", "--ram", "8192", "--disk", "0", "hpcvm"]
    props = dict(p.split("=", 1) for p in calls[1][4::2])
    assert props["hw:cpu_policy"] == "dedicated" and props["hw:mem_page_size"] == "2MB"
    nodes = int(props["hw:numa_nodes"])
    cpus = [c for n in range(nodes) for c in parse_cpu_list(props[f"hw:numa_cpus.{n}"])]
    assert sorted(cpus) == list(range(8))
    assert sum(int(props[f"hw:numa_mem.{n}"]) for n in range(nodes)) == 8192


def test_a_note_with_a_newline_stays_a_comment(tmp_path: Path) -> None:
    """A hand-edited plan's host tuning line with a newline must not become a command."""
    plan = spread(hand.numa()).model_copy(
        update={"host_tuning": ("sysctl -w x=1\nopenstack flavor delete r-numa",)}
    )
    calls = _run_commands(openstack_flavor_commands(plan), tmp_path)
    assert [c[:2] for c in calls] == [["flavor", "create"], ["flavor", "set"]]


def test_commands_print_the_compute_hosts_nova_conf(tmp_path: Path) -> None:
    """hpc (cores first) on a 2 nodes x 6 cores x 2 threads machine: the output's
    cpu_dedicated_set is one thread of every core without housekeeping, by hwloc's own
    view of the cores, and cpu_shared_set the housekeeping PUs; the flavor asks for
    ``prefer`` (``isolate`` never lands on an SMT host) and shares emulator threads."""
    xml = TOPOLOGIES / "xml" / f"{POOLED_XML}.xml"
    host = roomy(host_from("xml", str(xml)))
    plan = make_plan(host, PlanRequest(name="h", profile="hpc", vcpus=4, memory_bytes=GIB))
    script = openstack_flavor_commands(plan, host)
    conf = dict(
        line[len("#   ") :].split(" = ", 1) for line in script.splitlines() if " = " in line
    )
    dedicated = set(parse_cpu_list(conf["cpu_dedicated_set"]))
    shared = set(parse_cpu_list(conf["cpu_shared_set"]))
    hw = machine(lstopo_xml(xml=xml))
    assert hw.smt and shared == set(plan.housekeeping_pus) and shared
    for core in hw.cores:
        assert len(core & dedicated) == (0 if core & shared else 1), sorted(core)
    calls = _run_commands(script, tmp_path)
    props = dict(p.split("=", 1) for p in calls[1][4::2])
    assert props["hw:cpu_thread_policy"] == "prefer"
    assert props["hw:emulator_threads_policy"] == "share"


def test_cli_refuses_stacked_guest_nodes_in_one_line(tmp_path: Path) -> None:
    """hwloc's synthetic one-node machine, two guest nodes asked for: exit 3, one line
    naming the fix, nothing on stdout (no half-written script)."""
    xml = tmp_path / "one-node.xml"
    done = subprocess.run(
        ["lstopo-no-graphics", "--input", "node:1 core:4 pu:1", "--of", "xml"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    xml.write_text(done.stdout)
    result = run_plan(
        "--profile", "numa", "--vcpus", "2", "--memory", "256M", "--page-size", "4K",
        "--guest-nodes", "2", "--topology", xml, "--format", "openstack",
    )  # fmt: skip
    assert result.returncode == 3 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "--guest-nodes 1" in line and "Traceback" not in line


def test_a_plan_for_another_host_is_a_usage_error() -> None:
    """hpc_kvm pins PUs up to 51; a 24-PU machine has none of 24-51: one line, no
    flavor for a host the plan was not made for."""
    host = host_from("xml", str(TOPOLOGIES / "xml" / f"{POOLED_XML}.xml"))
    with pytest.raises(UsageError, match="does not have") as info:
        openstack_flavor(hand.hpc_kvm(), host)
    assert "\n" not in str(info.value)


def test_cli_renders_for_the_host_it_planned_on(tmp_path: Path) -> None:
    """`hpcvm plan --format openstack` hands the renderer the host it read: the output
    carries that machine's nova.conf sets, and a flat guest spread over its two nodes is
    refused (exit 3, one line) instead of rendered."""
    xml = pooled_xml(tmp_path)
    ok = run_plan(
        "--profile", "hpc", "--vcpus", "4", "--memory", "1G", "--topology", xml,
        "--format", "openstack",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "cpu_dedicated_set =" in ok.stdout and "cpu_shared_set =" in ok.stdout
    spread_flat = run_plan(
        "--profile", "pinned", "--vcpus", "16", "--memory", "1G", "--topology", xml,
        "--format", "openstack",
    )  # fmt: skip
    assert spread_flat.returncode == 3 and spread_flat.stdout == "", spread_flat.stdout
    (line,) = [ln for ln in spread_flat.stderr.splitlines() if ln.startswith("hpcvm: error:")]
    assert "--profile numa" in line


FEWER = re.compile(r"at most (\d+) vCPUs(?: \((\d+) with --smt pack\))?")


def test_fewer_vcpus_named_by_a_flat_refusal_render(all_snapshots: list[Snapshot]) -> None:
    """A flat guest spread over host nodes is refused with a vCPU count that stays on
    one node; planning that count (with the same --smt, or the --smt pack count it
    names) must give a flavor, not the same refusal: under --smt cores a smaller plan
    is one vCPU per core again (16 vCPUs on 6 cores x 2 threads per node once said
    "at most 12", which re-planned over two nodes and was refused again)."""
    followed = 0
    for snap in all_snapshots:
        host = roomy(host_from(snap.kind, str(snap.path)))
        usable = sum(1 for p in host.pus if p.online and p.allowed)
        for profile in ("pinned", "hugepages"):
            for smt in ("cores", "pack", "require"):
                request = PlanRequest(
                    name="f", profile=profile, vcpus=usable, memory_bytes=GIB, smt=smt
                )
                try:
                    plan = make_plan(host, request)
                    openstack_flavor(plan, host)
                    continue
                except HpcvmError as err:
                    found = FEWER.search(str(err))
                if found is None:
                    continue
                tries = [(int(found[1]), smt)] + ([(int(found[2]), "pack")] if found[2] else [])
                for vcpus, policy in tries:
                    again = request.model_copy(update={"vcpus": vcpus, "smt": policy})
                    openstack_flavor(make_plan(host, again), host)  # raises if refused again
                    followed += 1
    assert followed, "no snapshot gave a flat plan over several nodes"


def test_numa_guests_on_small_pages_split_in_whole_mib(all_snapshots: list[Snapshot]) -> None:
    """Nova counts hw:numa_mem.N in MiB: a numa plan on 4K pages whose vCPUs split
    unevenly over guest nodes (3 vCPUs over 2 nodes of 2 cores: 1G as 2:1) must still
    render, its guest nodes' MiB summing to the flavor's RAM. The split once gave
    699050.67K-sized parts and a refusal asking for --memory in M or G, which it was."""
    uneven = 0
    for snap in all_snapshots:
        host = roomy(snapshot_host(snap))
        usable = sum(1 for p in host.pus if p.online and p.allowed)
        for vcpus in range(1, min(usable, 12) + 1):
            request = PlanRequest(
                name="m", profile="numa", vcpus=vcpus, memory_bytes=GIB, page_size_bytes=4 * KIB
            )
            try:
                plan = make_plan(host, request)
                render = openstack_flavor(plan, host)
            except InfeasiblePlanError:
                continue  # e.g. stacked guest nodes: refused with exit 3, tested above
            specs = render.extra_specs
            mems = [int(specs[f"hw:numa_mem.{n.index}"]) for n in plan.guest_nodes]
            assert sum(mems) == render.flavor["ram"] == GIB // MIB, (snap.name, vcpus)
            uneven += len(set(mems)) > 1
    assert uneven, "no snapshot gave guest nodes of unequal memory"


@pytest.mark.parametrize("made", ["node 0 offline", "cgroup cpus 0-11 mems 1-4"])
def test_non_local_guest_nodes_are_refused_with_a_count_that_renders(
    made: str, snapshots_dir: Path, tmp_path: Path
) -> None:
    """Node 0 offline (its CPUs online, in no node), or a cgroup whose CPUs reach node 0
    while its memory set bars it: a numa plan over every usable PU puts a guest node on
    those PUs, which Nova cannot express (no host cell, or memory stacked on another
    guest node's node). The refusal names the vCPUs that local PUs take, and that plan
    renders (it was told a --guest-nodes count, which the planner refuses)."""
    from tests.unit.test_plan_real_machines import (
        CGROUP_SNAPSHOT,
        OFFLINE_SNAPSHOT,
        cgroup_mems_snapshot,
        offline_node_snapshot,
    )

    if made == "node 0 offline":
        src = sysfs_root(snapshots_dir, OFFLINE_SNAPSHOT)
        root = offline_node_snapshot(src, tmp_path / "m", node=0)
    else:
        src = sysfs_root(snapshots_dir, CGROUP_SNAPSHOT)
        root = cgroup_mems_snapshot(src, tmp_path / "m", cpus="0-11", mems="1-4")
    host = roomy(host_from("sysfs", str(root)))
    usable = sum(1 for p in host.pus if p.online and p.allowed)
    request = PlanRequest(
        name="o", profile="numa", vcpus=usable, memory_bytes=GIB, page_size_bytes=4 * KIB
    )
    plan = make_plan(host, request)
    assert any(not n.local for n in plan.guest_nodes)
    with pytest.raises(InfeasiblePlanError, match=r"at most (\d+) vCPUs") as info:
        openstack_flavor(plan, host)
    assert "\n" not in str(info.value)
    found = FEWER.search(str(info.value))
    assert found is not None
    fewer = make_plan(host, request.model_copy(update={"vcpus": int(found[1])}))
    render = openstack_flavor(fewer, host)
    assert int(render.extra_specs["hw:numa_nodes"]) == len(fewer.guest_nodes)
