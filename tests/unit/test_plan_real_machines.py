"""Issue 8 on every real machine: plans bind memory only to allowed nodes, use whole
cores before SMT siblings across nodes, model CPUs without a node, and let memory pick
nodes too; checked against hwloc's own view, never against hpcvm's parser.

hwloc's view comes from one ``lstopo-no-graphics --of xml --disallowed`` run per
source, walked here by a few lines written for the tests: which NUMA nodes hold each PU
(none for a CPU whose node is offline), which core each PU is on, which nodes and PUs
this process is allowed (cgroup cpuset.cpus/.mems). Sources: every snapshot in
../shared/topologies/, two made from them the way Linux shows such machines (a Slurm
job whose cgroup bars memory nodes; node 0 offline), and hwloc synthetic machines with
2-8 nodes and 1-4 threads per core, some with a memory set restricted by hwloc itself
(``lstopo --input ... --allow nodeset=...``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcvm.errors import HpcvmError, InfeasiblePlanError
from hpcvm.host import HostTopology, discover
from hpcvm.plan import plan
from hpcvm.plan.model import SMT_POLICIES, PlanRequest, SmtPolicy, VMPlan
from hpcvm.units import GIB, MIB
from tests.conftest import SNAPSHOT_IDS, TOPOLOGIES, sysfs_root
from tests.plan_checks import check_plan, roomy


def _bits(text: str | None) -> frozenset[int]:
    """hwloc bitmap "0xff,,0x1" (32-bit words, most significant first)."""
    if not text:
        return frozenset()
    out: set[int] = set()
    words = [w for w in text.split(",")]
    for pos, word in enumerate(reversed(words)):
        value = int(word, 16) if word and "..." not in word else 0
        out |= {32 * pos + i for i in range(32) if value >> i & 1}
    return frozenset(out)


@dataclass(frozen=True)
class HwlocFacts:
    node_pus: dict[int, frozenset[int]]  # node os_index -> its cpuset
    allowed_nodes: frozenset[int]
    allowed_pus: frozenset[int]
    core_of: dict[int, int]  # PU os_index -> a core id (hwloc's logical order)

    def nodes_of(self, pu: int) -> set[int]:
        return {n for n, pus in self.node_pus.items() if pu in pus}


def lstopo_xml(*, fsroot: Path | None = None, xml: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLOC_")}
    env["HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES"] = "1"
    args = ["lstopo-no-graphics", "--of", "xml", "--disallowed"]
    if fsroot is not None:
        env.update(HWLOC_FSROOT=str(fsroot), HWLOC_THISSYSTEM="0")
        env["HWLOC_COMPONENTS"] = "-x86,-pci,-opencl,-gl"
    if xml is not None:
        args[1:1] = ["-i", str(xml)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=True)
    return done.stdout


def facts(text: str) -> HwlocFacts:
    root = ET.fromstring(text)
    machine = root.find("object")
    assert machine is not None
    node_pus: dict[int, frozenset[int]] = {}
    core_of: dict[int, int] = {}
    cores = 0

    def walk(obj: ET.Element, core: int | None) -> None:
        nonlocal cores
        for child in obj.findall("object"):
            kind = child.get("type")
            here = core
            if kind == "Core":
                here = cores
                cores += 1
            if kind == "NUMANode":
                node_pus[int(child.get("os_index", "0"))] = _bits(child.get("cpuset"))
            elif kind == "PU":
                pu = int(child.get("os_index", "0"))
                if here is None:
                    here = cores
                    cores += 1
                core_of[pu] = here
            walk(child, here)

    walk(machine, None)
    return HwlocFacts(
        node_pus=node_pus,
        allowed_nodes=_bits(machine.get("allowed_nodeset")),
        allowed_pus=_bits(machine.get("allowed_cpuset")),
        core_of=core_of,
    )


def synthetic_xml(description: str, out: Path, *, allow_nodes: list[int] | None = None) -> Path:
    """hwloc's XML of a synthetic machine, memory set restricted by hwloc itself."""
    args = ["lstopo-no-graphics", "--input", description]
    if allow_nodes is not None:
        mask = sum(1 << n for n in allow_nodes)
        args += ["--allow", f"nodeset={mask:#x}"]
    args += ["--of", "xml", str(out)]
    subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
    return out


CGROUP_STEP = Path("cgroup/unified/uid_2008/job_15389/step_0")


def cgroup_mems_snapshot(src: Path, dst: Path, *, cpus: str, mems: str) -> Path:
    """The 32amd64-4s2n4c-cgroup2 snapshot with its job's cgroup changed to ``cpus`` and
    ``mems`` (e.g. CPUs 0-11 but memory nodes 1-4): what Slurm does to a job."""
    shutil.copytree(src, dst, symlinks=True)
    (dst / CGROUP_STEP / "cpuset.cpus.effective").write_text(cpus + "\n")
    (dst / CGROUP_STEP / "cpuset.mems.effective").write_text(mems + "\n")
    return dst


def offline_node_snapshot(src: Path, dst: Path, node: int) -> Path:
    """A snapshot with NUMA node ``node`` offline as Linux shows it: no nodeN folder,
    node/online without it; its CPUs stay online but belong to no node."""
    shutil.copytree(src, dst, symlinks=True)
    base = dst / "sys" / "devices" / "system" / "node"
    before = sorted(int(p.name[4:]) for p in base.iterdir() if p.name[4:].isdigit())
    shutil.rmtree(base / f"node{node}")
    left = [n for n in before if n != node]
    for n in left:  # Linux lists distances to online nodes only
        row = (base / f"node{n}" / "distance").read_text().split()
        kept = [d for m, d in zip(before, row, strict=True) if m != node]
        (base / f"node{n}" / "distance").write_text(" ".join(kept) + "\n")
    for name in ("online", "has_cpu", "has_normal_memory"):
        if (base / name).exists():
            (base / name).write_text(",".join(map(str, left)) + "\n")
    return dst


# ---------------------------------------------------------------- the machines

# 2-8 nodes x 1-4 threads per core: every node count, every thread count twice or more
SHAPES = ((2, 1), (2, 4), (3, 2), (4, 3), (5, 1), (6, 2), (7, 4), (8, 3))
SYNTHETIC = [f"numa:{n} core:4 pu:{t}" for n, t in SHAPES]
CGROUP_SNAPSHOT = "32amd64-4s2n4c-cgroup2"
OFFLINE_SNAPSHOT = "64amd64-4s2n4ca2co"


@dataclass(frozen=True)
class Machine:
    label: str
    host: HostTopology
    hw: HwlocFacts
    source: list[str]  # hpcvm's flags naming it (--sysfs-root X / --topology X)


def _machine(label: str, *, fsroot: Path | None = None, xml: Path | None = None) -> Machine:
    host = discover(sysfs_root=fsroot, xml=xml)
    hw = facts(lstopo_xml(fsroot=fsroot, xml=xml))
    flag = ["--sysfs-root", str(fsroot)] if fsroot is not None else ["--topology", str(xml)]
    return Machine(label, host, hw, flag)


@pytest.fixture(scope="module")
def made(snapshots_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Machine]:
    """The machines the shared snapshots lack, made from them or by hwloc."""
    tmp = tmp_path_factory.mktemp("issue8")
    cg = cgroup_mems_snapshot(
        sysfs_root(snapshots_dir, CGROUP_SNAPSHOT), tmp / "cg", cpus="0-11", mems="1-4"
    )
    off = offline_node_snapshot(sysfs_root(snapshots_dir, OFFLINE_SNAPSHOT), tmp / "off0", 0)
    out = {
        "cgroup mems 1-4": _machine("cgroup mems 1-4", fsroot=cg),
        "node 0 offline": _machine("node 0 offline", fsroot=off),
    }
    for i, desc in enumerate(SYNTHETIC):
        n = int(desc.split()[0].split(":")[1])
        out[desc] = _machine(desc, xml=synthetic_xml(desc, tmp / f"s{i}.xml"))
        barred = f"{desc} mems 1-{n - 1}"
        path = synthetic_xml(desc, tmp / f"s{i}-mems.xml", allow_nodes=list(range(1, n)))
        out[barred] = _machine(barred, xml=path)
    return out


@pytest.fixture(scope="module")
def machines(snapshots_dir: Path, made: dict[str, Machine]) -> list[Machine]:
    found = list(made.values())
    for ident in SNAPSHOT_IDS:
        kind, name = ident.split(":", 1)
        if kind == "sysfs":
            found.append(_machine(ident, fsroot=sysfs_root(snapshots_dir, name)))
        else:
            found.append(_machine(ident, xml=TOPOLOGIES / "xml" / f"{name}.xml"))
    return found


# ---------------------------------------------------------------- host model vs hwloc


def test_host_model_agrees_with_hwloc(machines: list[Machine]) -> None:
    """Each online PU's node is one hwloc puts it in, or None where hwloc puts it in
    none; allowed nodes and PUs are hwloc's allowed sets."""
    for m in machines:
        for pu in m.host.pus:
            if not pu.online:
                continue
            nodes = m.hw.nodes_of(pu.os_index)
            if nodes:
                assert pu.node in nodes, f"{m.label}: PU {pu.os_index} on {pu.node}, not {nodes}"
            else:
                assert pu.node is None, f"{m.label}: PU {pu.os_index} has no node in hwloc"
            assert pu.allowed == (pu.os_index in m.hw.allowed_pus), m.label
        for node in m.host.nodes:
            assert node.allowed == (node.os_index in m.hw.allowed_nodes), m.label
    labels = {m.label: m for m in machines}
    assert set(labels["node 0 offline"].host.nodeless_pus()) == set(range(8))
    assert [n.os_index for n in labels["cgroup mems 1-4"].host.allowed_nodes()] == [1, 2, 3, 4]


# ---------------------------------------------------------------- plans vs hwloc


def _sizes(m: Machine) -> list[int]:
    usable = len(m.hw.allowed_pus & set(m.hw.core_of))
    cores = len({m.hw.core_of[p] for p in m.hw.allowed_pus if p in m.hw.core_of})
    return sorted({1, max(1, cores // 2), cores, min(cores + 1, usable), usable})


def _pu(pu: int | None) -> int:
    assert pu is not None
    return pu


def _check_against_hwloc(m: Machine, request: PlanRequest, p: VMPlan) -> None:
    hw = m.hw
    pus = p.vcpu_pus()
    where = f"{m.label} {request.smt} {request.vcpus}"
    assert set(pus) <= hw.allowed_pus, where
    for region in p.memory:
        assert set(region.host_nodes) <= hw.allowed_nodes, f"{where}: bound to a barred node"
    by_vcpu = {pl.vcpu: pl.host_pu for pl in p.placements}
    for g in p.guest_nodes:
        homes = {frozenset(hw.nodes_of(_pu(by_vcpu[v]))) for v in g.vcpus}
        assert len(homes) == 1, f"{where}: guest node {g.index} spans host nodes {homes}"
        (home,) = homes
        if not home:
            assert g.cpu_node is None and not g.local, f"{where}: node-less PUs claimed local"
        else:
            assert g.cpu_node in home, where
            # roomy(): every normal node has memory, so allowed is what decides
            assert g.local == (g.cpu_node in hw.allowed_nodes), where
    used_cores = [hw.core_of[pu] for pu in pus]
    siblings = len(set(used_cores)) < len(used_cores)
    allowed_home = {
        pu for pu in hw.allowed_pus if hw.nodes_of(pu) & hw.allowed_nodes and pu in hw.core_of
    }
    local_cores = len({hw.core_of[pu] for pu in allowed_home})
    if request.smt == "cores" and siblings:
        assert local_cores < request.vcpus, f"{where}: siblings with {local_cores} free cores"
    if request.smt == "require":
        sizes = {c: sum(1 for q in hw.allowed_pus if hw.core_of.get(q) == c) for c in used_cores}
        assert min(sizes.values()) >= 2, f"{where}: --smt require on a core without siblings"
    if len(allowed_home) >= request.vcpus:
        assert all(g.local for g in p.guest_nodes), f"{where}: non-local PUs used needlessly"


@pytest.mark.parametrize("smt", SMT_POLICIES)
def test_numa_plans_follow_hwloc_on_every_machine(machines: list[Machine], smt: SmtPolicy) -> None:
    planned = 0
    for m in machines:
        host = roomy(m.host)
        for vcpus in _sizes(m):
            request = PlanRequest(
                profile="numa", vcpus=vcpus, memory_bytes=512 * MIB, page_size_bytes=4096, smt=smt
            )
            try:
                result = plan(host, request)
            except InfeasiblePlanError as exc:
                assert "\n" not in str(exc)
                usable = len(m.hw.allowed_pus & set(m.hw.core_of))
                assert vcpus > usable or smt == "require", f"{m.label} {vcpus}: {exc}"
                continue
            check_plan(host, request, result)
            _check_against_hwloc(m, request, result)
            planned += 1
    assert planned > len(machines)


def test_hpc_and_pinned_plans_respect_the_memory_set(machines: list[Machine]) -> None:
    for m in machines:
        host = roomy(m.host)
        for profile in ("hpc", "hugepages"):
            request = PlanRequest(profile=profile, vcpus=2, memory_bytes=512 * MIB)
            try:
                result = plan(host, request)
            except HpcvmError as exc:
                assert "\n" not in str(exc)
                continue
            check_plan(host, request, result)
            assert set(result.hugepages_needed) <= m.hw.allowed_nodes, m.label
            for region in result.memory:
                assert set(region.host_nodes) <= m.hw.allowed_nodes, m.label


# ---------------------------------------------------------------- the CLI, in words


def hpcvm(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400"}  # rich: one table row per line
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def test_smt_policies_on_two_nodes_of_eight_cores_by_two(tmp_path: Path) -> None:
    """The issue's host: 16 vCPUs take one PU of each of the 16 cores over both nodes
    (cores), or both PUs of one node's 8 cores (pack, require); hwloc says which PU
    is on which core and node."""
    xml = synthetic_xml("numa:2(memory=16GiB) core:8 pu:2", tmp_path / "h.xml")
    hw = facts(lstopo_xml(xml=xml))
    base = ["plan", "--profile", "numa", "--vcpus", "16", "--memory", "2G", "--page-size", "4K"]
    for smt, cores, nodes in (("cores", 16, 2), ("pack", 8, 1), ("require", 8, 1)):
        done = hpcvm(*base, "--smt", smt, "--topology", str(xml), "--format", "json")
        assert done.returncode == 0, done.stderr
        p = VMPlan.model_validate_json(done.stdout)
        pus = p.vcpu_pus()
        assert len({hw.core_of[pu] for pu in pus}) == cores, smt
        assert len(set().union(*(hw.nodes_of(pu) for pu in pus))) == nodes == len(p.guest_nodes)
        assert p.topology.threads == (1 if smt == "cores" else 2)
    table = hpcvm(*base, "--topology", str(xml))
    assert (
        "hw:cpu_thread_policy=isolate" in table.stdout and "SMT siblings left idle" in table.stdout
    )
    flat = synthetic_xml("numa:2 core:8 pu:1", tmp_path / "flat.xml")
    refused = hpcvm(*base, "--smt", "require", "--topology", str(flat))
    assert refused.returncode == 3 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "--smt require" in refused.stderr


def test_cores_run_short_every_node_gives_its_cores_first(tmp_path: Path) -> None:
    """4 nodes x 8 cores x 2 threads: 33 vCPUs under --smt cores take all 32 cores
    and one sibling (vCPUs on shared cores: 2), not the 3 nodes whose PUs would hold
    them (24 cores, 9 siblings); hpc's housekeeping core per node leaves 28 cores for 30
    vCPUs. hwloc says which PU is on which core and node; the table says as many."""
    xml = synthetic_xml("pack:2 numa:2(memory=8GiB) core:8 pu:2", tmp_path / "h.xml")
    hw = facts(lstopo_xml(xml=xml))
    for profile, vcpus, cores in (("numa", 33, 32), ("hpc", 30, 28)):
        args = ["plan", "--profile", profile, "--vcpus", str(vcpus), "--memory", "4G"]
        args += ["--page-size", "4K", "--topology", str(xml)]
        done = hpcvm(*args, "--format", "json")
        assert done.returncode == 0, done.stderr
        pus = VMPlan.model_validate_json(done.stdout).vcpu_pus()
        per_core = Counter(hw.core_of[pu] for pu in pus)
        assert len(per_core) == cores, profile
        shared = sum(n for n in per_core.values() if n > 1)
        assert shared == 2 * (vcpus - cores), f"{profile}: {shared} vCPUs share cores"
        assert len(set().union(*(hw.nodes_of(pu) for pu in pus))) == 4
        table = hpcvm(*args).stdout
        assert f"so {vcpus - cores} vCPU(s) share a core" in " ".join(table.split())


def test_memory_picks_nodes_and_refusal_names_the_largest_size(tmp_path: Path) -> None:
    """Four 1 GiB nodes (hwloc's synthetic memory): 2 vCPUs and 800M do not fit one node
    with QEMU's overhead (TCG's: a synthetic host has no KVM), so they spread; 8G fits
    no choice: exit 3, one line naming the largest size, which then plans."""
    xml = synthetic_xml("numa:4(memory=1GiB) core:4 pu:1", tmp_path / "small.xml")
    base = ["plan", "--profile", "numa", "--vcpus", "2", "--page-size", "4K", "--topology"]
    done = hpcvm(*base, str(xml), "--memory", "800M", "--format", "json")
    assert done.returncode == 0, done.stderr
    p = VMPlan.model_validate_json(done.stdout)
    assert len(p.guest_nodes) == 2 and all(g.memory_bytes == 400 * MIB for g in p.guest_nodes)
    refused = hpcvm(*base, str(xml), "--memory", "8G")
    assert refused.returncode == 3 and refused.stdout == "" and refused.stderr.count("\n") == 1
    best = refused.stderr.split("use --memory ")[1].split()[0]
    assert hpcvm(*base, str(xml), "--memory", best).returncode == 0


def test_host_and_plan_explain_barred_and_nodeless(made: dict[str, Machine]) -> None:
    cg = made["cgroup mems 1-4"]
    host = hpcvm("host", *cg.source)
    assert host.returncode == 0, host.stderr
    assert "disallowed memory nodes" in host.stdout and "only to nodes 1-4" in host.stdout
    args = ["--profile", "numa", "--vcpus", "10", "--memory", "1G", "--page-size", "4K"]
    planned = hpcvm("plan", *args, *cg.source)
    assert planned.returncode == 0, planned.stderr
    assert "outside cpuset.mems" in planned.stdout and "nearest allowed node" in planned.stdout
    off = made["node 0 offline"]
    host = hpcvm("host", *off.source)
    assert "CPUs without a node" in host.stdout and "0-7" in host.stdout


def test_pus_of_a_node_without_memory_bind_to_the_nearest_node_with_memory(
    tmp_path: Path,
) -> None:
    """A node with CPUs but no memory (memory-less nodes exist on real machines): its
    PUs come last and their memory goes to the nearest node that has some."""
    xml = synthetic_xml("numa:3(memory=8GiB) core:4 pu:1", tmp_path / "h.xml")
    host = discover(xml=xml)
    nodes = tuple(
        n.model_copy(update={"memory_bytes": 0}) if n.os_index == 0 else n for n in host.nodes
    )
    host = host.model_copy(update={"nodes": nodes})
    small = plan(host, PlanRequest(profile="numa", vcpus=4, memory_bytes=GIB, page_size_bytes=4096))
    assert [(g.cpu_node, g.host_node, g.local) for g in small.guest_nodes] == [(1, 1, True)]
    request = PlanRequest(profile="numa", vcpus=12, memory_bytes=GIB, page_size_bytes=4096)
    big = plan(host, request)
    check_plan(host, request, big)
    nearest = min((1, 2), key=lambda n: (host.distance(0, n), n))
    assert (big.guest_nodes[0].cpu_node, big.guest_nodes[0].host_node) == (0, nearest)
    assert not big.guest_nodes[0].local
    assert any("which has no memory" in d.text for d in big.decisions)
