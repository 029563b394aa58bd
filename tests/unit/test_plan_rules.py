"""The planner's rules one at a time, on real snapshots (made roomy or given known huge
page counts with model_copy) so each expected number comes from the test's own setup."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.host import HostTopology
from hpcvm.host.model import HugePagePool, KvmInfo
from hpcvm.plan import PROFILES, plan
from hpcvm.plan.model import PROFILE_NAMES, PlanRequest
from hpcvm.units import GIB, MIB, format_cpu_list, parse_cpu_list
from tests.conftest import TOPOLOGIES, sysfs_root
from tests.plan_checks import check_plan, host_from, roomy, synthetic_host, usable_cores, with_pools

TWO_M = 2 * MIB


Load = Callable[[str], HostTopology]


@pytest.fixture(scope="module")
def snap(snapshots_dir: Path) -> Load:
    def load(name: str) -> HostTopology:
        if name.startswith("xml:"):
            return host_from("xml", str(TOPOLOGIES / "xml" / f"{name[4:]}.xml"))
        return host_from("sysfs", str(sysfs_root(snapshots_dir, name)))

    return load


def _req(**kw: object) -> PlanRequest:
    return PlanRequest.model_validate({"memory_bytes": GIB, **kw})


# ---------------------------------------------------------------- request validation


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        ({"profile": "numa", "vcpus": 0}, r"--vcpus must be at least 1"),
        ({"profile": "numa", "vcpus": 1, "memory_bytes": 0}, r"--memory must be positive"),
        ({"profile": "numa", "vcpus": 1, "memory_bytes": GIB + 5}, r"whole number of MiB"),
        ({"profile": "numa", "vcpus": 1, "memory_bytes": 3 * MIB}, r"use --memory 2M or 4M"),
        ({"profile": "pinned", "vcpus": 1, "page_size_bytes": TWO_M}, r"--profile hugepages"),
        ({"profile": "naive", "vcpus": 1, "page_size_bytes": GIB}, r"--profile hugepages"),
        ({"profile": "numa", "vcpus": 1, "page_size_bytes": 3 * MIB}, r"use 4K, 2M or 1G"),
        ({"profile": "hugepages", "vcpus": 1, "page_size_bytes": 4096}, r"--profile pinned"),
        ({"profile": "numa", "vcpus": 1, "housekeeping": 1}, r"--housekeeping applies to"),
        ({"profile": "hpc", "vcpus": 1, "housekeeping": -1}, r"0 or more cores"),
        ({"profile": "pinned", "vcpus": 2, "guest_nodes": 2}, r"--guest-nodes applies to"),
        ({"profile": "numa", "vcpus": 1, "guest_nodes": 2}, r"at least as many vCPUs"),
        ({"profile": "numa", "vcpus": 1, "passthrough": ("0000:43:00.0",)}, r"hpc only"),
        ({"profile": "naive", "vcpus": 1, "smt": "pack"}, r"--smt applies to pinned profiles"),
    ],
)
def test_malformed_requests_are_usage_errors(
    snap: Load, kw: dict[str, object], pattern: str
) -> None:
    host = roomy(snap("40intel64-2g2n4c+pci"))
    with pytest.raises(UsageError, match=pattern) as info:
        plan(host, _req(**kw))
    assert "\n" not in str(info.value)


def test_page_size_the_host_does_not_offer_is_the_hosts_limit(snap: Load) -> None:
    """2amd64-2n records neither pools nor CPU flags: no huge page size is known. That
    is what the host cannot give (exit 3, as README's table says), not a malformed
    request."""
    host = snap("2amd64-2n")
    with pytest.raises(
        InfeasiblePlanError, match=r"host offers no 2M huge pages.*use --page-size 4K"
    ):
        plan(host, _req(profile="numa", vcpus=1))
    check_plan(
        host,
        _req(profile="numa", vcpus=1, page_size_bytes=4096),
        plan(host, _req(profile="numa", vcpus=1, page_size_bytes=4096)),
    )


def test_defaults_per_profile(snap: Load) -> None:
    host = roomy(snap("40intel64-2g2n4c+pci"))
    for name in PROFILE_NAMES:
        p = plan(host, _req(profile=name, vcpus=2))
        assert p.page_size_bytes == (TWO_M if PROFILES[name].hugepages else 4096)


def test_plan_is_deterministic(snap: Load) -> None:
    host = roomy(snap("64amd64-4s2n4ca2co"))
    request = _req(profile="hpc", vcpus=20, memory_bytes=4 * GIB)
    assert plan(host, request) == plan(host, request)


# ---------------------------------------------------------------- CPUs


def test_offline_and_disallowed_cpus_named_in_the_refusal(snap: Load) -> None:
    host = snap("16em64t-4s2c2t-offlines")
    offline = [p.os_index for p in host.pus if not p.online]
    usable = sum(1 for p in host.pus if p.online and p.allowed)
    with pytest.raises(InfeasiblePlanError) as info:
        plan(host, _req(profile="pinned", vcpus=usable + 1))
    text = str(info.value)
    assert f"only {usable} PUs are usable" in text
    assert f"offline: {format_cpu_list(offline)}" in text

    cg = snap("32amd64-4s2n4c-cgroup2")
    outside = [p.os_index for p in cg.pus if p.online and not p.allowed]
    with pytest.raises(InfeasiblePlanError, match=re.escape(format_cpu_list(outside))):
        plan(cg, _req(profile="naive", vcpus=len(cg.pus)))


def test_housekeeping_reserve_in_the_refusal(snap: Load) -> None:
    host = roomy(snap("40intel64-2g2n4c+pci"))
    cores = usable_cores(host)
    reserved = sum(len(c) for n in cores for c in cores[n][:2])
    left = sum(len(c) for n in cores for c in cores[n][2:])
    with pytest.raises(InfeasiblePlanError) as info:
        plan(host, _req(profile="hpc", vcpus=left + 1, housekeeping=2))
    assert f"only {left} PUs are usable" in str(info.value)
    assert f"{reserved} reserved for housekeeping with --housekeeping 2" in str(info.value)
    check_plan(
        host,
        _req(profile="hpc", vcpus=left, housekeeping=2),
        plan(host, _req(profile="hpc", vcpus=left, housekeeping=2)),
    )


def test_smt_siblings_only_after_every_core(snap: Load) -> None:
    """16em64t-4s2c2t: 8 cores x 2 threads on one node. 8 vCPUs take one PU of every
    core; 16 take both, shown as guest threads; 10 mix and stay threads=1 with a warning."""
    host = snap("16em64t-4s2c2t")
    core_of = {pu: c.index for c in host.cores for pu in c.pus}
    eight = plan(host, _req(profile="pinned", vcpus=8))
    assert len({core_of[pu] for pu in eight.vcpu_pus()}) == 8
    assert eight.topology.threads == 1 and not any("SMT" in w for w in eight.warnings)
    full = plan(host, _req(profile="pinned", vcpus=16))
    assert full.topology.threads == 2 and full.topology.cores == 8
    pus = full.vcpu_pus()
    assert all(core_of[pus[i]] == core_of[pus[i + 1]] for i in range(0, 16, 2))
    ten = plan(host, _req(profile="pinned", vcpus=10))
    assert ten.topology.threads == 1
    assert any("SMT siblings" in w for w in ten.warnings)
    check_plan(host, _req(profile="pinned", vcpus=10), ten)


def test_uneven_split_gives_one_socket(snap: Load) -> None:
    host = roomy(snap("64amd64-4s2n4ca2co"))  # 8 nodes of 8 PUs
    p = plan(host, _req(profile="numa", vcpus=12, memory_bytes=3 * GIB))
    assert [len(n.vcpus) for n in p.guest_nodes] == [6, 6]
    assert p.topology.sockets == 2
    p = plan(host, _req(profile="numa", vcpus=17, memory_bytes=3 * GIB))
    counts = [len(n.vcpus) for n in p.guest_nodes]
    assert sorted(counts) == [5, 6, 6] and p.topology.sockets == 1


def test_nearest_nodes_chosen(snap: Load) -> None:
    """Two nodes' worth of vCPUs: node 0 and the node nearest to it."""
    host = roomy(snap("64amd64-4s2n4ca2co"))
    p = plan(host, _req(profile="numa", vcpus=16, memory_bytes=2 * GIB))
    used = [n.host_node for n in p.guest_nodes]
    others = [n.os_index for n in host.nodes if n.os_index != 0]
    nearest = min(others, key=lambda n: (host.distance(0, n), n))
    assert used == sorted([0, nearest])


def test_sparse_node_numbers_kept(snap: Load) -> None:
    host = roomy(snap("nvidiagpunumanodes"))  # nodes 0 and 8 hold the CPUs
    cpu_nodes = sorted({p.node for p in host.pus})
    p = plan(host, _req(profile="numa", vcpus=len(host.usable_pus()), memory_bytes=2 * GIB))
    assert [n.host_node for n in p.guest_nodes] == cpu_nodes
    assert set(p.hugepages_needed) == set(cpu_nodes)
    memory_only = {n.os_index for n in host.nodes if n.kind == "memory-only"}
    assert memory_only and not memory_only & {r.host_nodes[0] for r in p.memory}


# ---------------------------------------------------------------- vNUMA


def test_two_guest_nodes_on_one_host_node(snap: Load) -> None:
    host = roomy(snap("16em64t-4s2c2t"))
    request = _req(profile="numa", vcpus=4, memory_bytes=2 * GIB, guest_nodes=2)
    p = plan(host, request)
    check_plan(host, request, p)
    assert [n.host_node for n in p.guest_nodes] == [0, 0]
    assert p.guest_distances == ((10, 11), (11, 10))
    assert p.topology.sockets == 2
    assert any("local+1" in d.text for d in p.decisions)


def test_guest_nodes_must_be_a_multiple_of_used_host_nodes(snap: Load) -> None:
    host = roomy(snap("40intel64-2g2n4c+pci"))  # 10 PUs per node: 12 vCPUs use 2 nodes
    with pytest.raises(UsageError, match=r"--guest-nodes 3 is not a multiple of the 2 host"):
        plan(host, _req(profile="numa", vcpus=12, guest_nodes=3))
    p = plan(host, _req(profile="numa", vcpus=12, guest_nodes=4))
    assert [n.host_node for n in p.guest_nodes] == [0, 0, 1, 1]


def test_memory_that_cannot_be_split_names_the_smallest_size(snap: Load) -> None:
    """1G pages over three guest nodes: 2G gives one node none; 3G is the smallest fit."""
    host = roomy(snap("64amd64-4s2n4ca2co"))
    request = _req(
        profile="numa", vcpus=3, guest_nodes=3, memory_bytes=2 * GIB, page_size_bytes=GIB
    )
    with pytest.raises(UsageError, match=r"use --memory 3G or more"):
        plan(host, request)
    fixed = request.model_copy(update={"memory_bytes": 3 * GIB})
    check_plan(host, fixed, plan(host, fixed))


def test_memory_decides_the_nodes_and_refusal_names_a_size_that_fits(snap: Load) -> None:
    """Issue 8: nodes hold the vCPUs *and* their memory. 8G of ordinary memory per node:
    2 vCPUs with 12G fit one node by CPU but not by memory, so they spread over two
    nodes (6G each); 20G fits no choice (2 vCPUs use at most 2 nodes), and the refusal
    names the largest size that does, which then plans while 1M more does not."""
    host = roomy(snap("40intel64-2g2n4c+pci"), memory=8 * GIB)  # 2M pools hold 8G: 0 left
    host = with_pools(host, TWO_M, total=0, free=0)
    host = with_pools(host, GIB, total=0, free=0)
    request = _req(profile="numa", vcpus=2, memory_bytes=12 * GIB, page_size_bytes=4096)
    spread = plan(host, request)
    check_plan(host, request, spread)
    assert [n.memory_bytes for n in spread.guest_nodes] == [6 * GIB, 6 * GIB]
    assert any("memory decided" in d.text for d in spread.decisions)
    big = request.model_copy(update={"memory_bytes": 20 * GIB})
    with pytest.raises(
        InfeasiblePlanError, match=r"no choice of host nodes holds 2 vCPU\(s\)"
    ) as info:
        plan(host, big)
    best = int(re.search(r"use --memory (\d+)M or less", str(info.value))[1]) * MIB  # type: ignore[index]
    ok = request.model_copy(update={"memory_bytes": best})
    check_plan(host, ok, plan(host, ok))
    with pytest.raises(InfeasiblePlanError):
        plan(host, request.model_copy(update={"memory_bytes": best + MIB}))


# ---------------------------------------------------------------- huge pages


def test_refusal_says_how_many_pages_to_reserve_where(snap: Load) -> None:
    """All 40 vCPUs over the 4 nodes, 8G: 1024 pages per node. Node 1 has 300 reserved of
    which 200 are free; the others plenty. Reserve 824 more on node 1: echo 1124."""
    host = roomy(snap("40intel64-2g2n4c+pci"))
    nodes = tuple(
        n.model_copy(update={"hugepages": (HugePagePool(size_bytes=TWO_M, total=300, free=200),)})
        if n.os_index == 1
        else n
        for n in host.nodes
    )
    host = host.model_copy(update={"nodes": nodes})
    request = _req(profile="numa", vcpus=40, memory_bytes=8 * GIB)
    with pytest.raises(InfeasiblePlanError) as info:
        plan(host, request)
    assert str(info.value) == (
        "not enough free 2M huge pages on host node 1: the plan needs 1024 (2G), 200 are "
        "free; reserve 824 more: echo 1124 > "
        "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
    )


def test_flat_hugepages_counts_free_pages_over_all_nodes(snap: Load) -> None:
    """Unbound memory may come from any node: 4 nodes x 250 free = 1000 < 1024 needed;
    the host-wide pool is 4 x 300 = 1200, so echo 1224. With 260 free per node it fits."""
    base = roomy(snap("40intel64-2g2n4c+pci"))
    request = _req(profile="hugepages", vcpus=2, memory_bytes=2 * GIB)
    with pytest.raises(InfeasiblePlanError) as info:
        plan(with_pools(base, TWO_M, total=300, free=250), request)
    assert str(info.value) == (
        "not enough free 2M huge pages on the host: the plan needs 1024 (2G), 1000 are "
        "free; reserve 24 more: echo 1224 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    )
    host = with_pools(base, TWO_M, total=300, free=260)
    check_plan(host, request, plan(host, request))


def test_unknown_free_counts_are_checked_against_totals_with_a_warning(snap: Load) -> None:
    base = roomy(snap("40intel64-2g2n4c+pci"))
    request = _req(profile="numa", vcpus=2, memory_bytes=2 * GIB)  # 1024 pages on node 0
    host = with_pools(base, TWO_M, total=1024, free=None)
    p = plan(host, request)
    check_plan(host, request, p)
    assert any("could not be checked" in w for w in p.warnings)
    short = with_pools(base, TWO_M, total=1000, free=None)
    # 2 vCPUs now spread over two nodes (memory decides, issue 8); 1 vCPU cannot
    spread = plan(short, request)
    assert [n.memory_bytes for n in spread.guest_nodes] == [GIB, GIB]
    with pytest.raises(
        InfeasiblePlanError, match=r"1000 are reserved .*reserve 24 more: echo 1024 "
    ):
        plan(short, request.model_copy(update={"vcpus": 1}))


def test_one_gig_pages_hint_at_boot_reservation(snap: Load) -> None:
    host = with_pools(roomy(snap("40intel64-2g2n4c+pci")), GIB, total=0, free=0)
    with pytest.raises(InfeasiblePlanError, match=r"echo 2 > .*hugepages-1048576kB.*at boot"):
        plan(host, _req(profile="numa", vcpus=2, memory_bytes=2 * GIB, page_size_bytes=GIB))


def test_mem_path_from_the_host_mounts(snap: Load) -> None:
    host = roomy(snap("40intel64-2g2n4c+pci"))
    p = plan(host, _req(profile="numa", vcpus=2))
    assert {r.mem_path for r in p.memory} == {"/dev/hugepages"}
    mounted = host.model_copy(update={"hugetlbfs_mounts": {TWO_M: "/mnt/huge2m"}})
    p = plan(mounted, _req(profile="numa", vcpus=2))
    assert {r.mem_path for r in p.memory} == {"/mnt/huge2m"}
    p = plan(host, _req(profile="hpc", vcpus=2, page_size_bytes=GIB))
    assert {r.mem_path for r in p.memory} == {"/dev/hugepages1G"}


# ---------------------------------------------------------------- accelerator, CPU, tuning


def _with_kvm(host: HostTopology, usable: bool) -> HostTopology:
    kvm = KvmInfo(device=True, hw_virt=usable, usable=usable, reason="test: " + str(usable))
    return host.model_copy(update={"kvm": kvm})


def test_kvm_host_gets_host_cpu_invtsc_kvm_clock(snap: Load) -> None:
    host = _with_kvm(roomy(snap("40intel64-2g2n4c+pci")), usable=True)
    request = _req(profile="hpc", vcpus=4)
    p = plan(host, request)
    check_plan(host, request, p)
    assert p.accel == "kvm" and p.cpu.model == "host" and p.cpu.features == ("invtsc",)
    assert "clocksource=kvm-clock" in p.guest_kernel_args and "tsc=reliable" in p.guest_kernel_args
    assert not any("TCG" in w for w in p.warnings)
    naive = plan(host, _req(profile="naive", vcpus=4))
    assert naive.cpu.model is None and naive.clock == "kvm-clock"


def test_kvm_requested_where_it_cannot_run_is_refused(snap: Load) -> None:
    host = _with_kvm(roomy(snap("40intel64-2g2n4c+pci")), usable=False)
    with pytest.raises(InfeasiblePlanError, match=r"cannot run an ordinary KVM guest: test: False"):
        plan(host, _req(profile="hpc", vcpus=2, accel="kvm"))
    auto = plan(host, _req(profile="hpc", vcpus=2))
    assert auto.accel == "tcg" and auto.cpu.model == "max" and auto.clock == "tsc"
    assert "test: False" in auto.accel_reason and "say nothing" in auto.accel_reason


def test_kvm_on_a_snapshot_with_vt_is_assumed_with_a_warning(snap: Load) -> None:
    host = roomy(snap("40intel64-2g2n4c+pci"))
    assert host.kvm.device is None and host.kvm.hw_virt
    p = plan(host, _req(profile="hpc", vcpus=2, accel="kvm"))
    assert p.accel == "kvm" and any("/dev/kvm" in w for w in p.warnings)
    no_vt = roomy(snap("16amd64-8n2c"))
    assert not no_vt.kvm.hw_virt
    with pytest.raises(InfeasiblePlanError, match="VT-x/AMD-V"):
        plan(no_vt, _req(profile="hpc", vcpus=2, accel="kvm"))


def test_tuning_lists_match_the_pin_set(snap: Load) -> None:
    host = roomy(snap("64amd64-4s2n4ca2co")).model_copy(update={"thp": "always"})
    p = plan(host, _req(profile="hpc", vcpus=12, memory_bytes=2 * GIB))
    line = next(t for t in p.host_tuning if "nohz_full=" in t)
    for key in ("nohz_full", "rcu_nocbs"):
        value = re.search(rf"{key}=(\S+)", line)[1]  # type: ignore[index]
        assert set(parse_cpu_list(value)) == set(p.vcpu_pus())
    irq = re.search(r"irqaffinity=(\S+)", line)[1]  # type: ignore[index]
    assert set(parse_cpu_list(irq)) == set(p.housekeeping_pus)
    assert any("transparent_hugepage" in t for t in p.host_tuning)
    for h, n in p.hugepages_needed.items():
        pool = host.node(h).pool(TWO_M)
        assert pool is not None and pool.free is not None
        keep = max(pool.total, pool.total - pool.free + n)  # never shrink a pool
        assert any(f"echo {keep} > /sys/devices/system/node/node{h}/" in t for t in p.host_tuning)
    args = dict(a.split("=", 1) for a in p.guest_kernel_args)
    assert parse_cpu_list(args["nohz_full"]) == list(range(1, 12))
    assert args["irqaffinity"] == "0"
    assert plan(host, _req(profile="numa", vcpus=12, memory_bytes=2 * GIB)).host_tuning == ()


def test_housekeeping_zero_shares_the_vcpu_pus() -> None:
    """A host too small for a housekeeping core (like this 2-PU machine) can still run
    hpc with --housekeeping 0: QEMU's threads share the vCPU PUs, with a warning."""
    host = synthetic_host("pack:1 numa:1 core:2 pu:1")
    p = plan(
        host,
        _req(profile="hpc", vcpus=2, housekeeping=0, page_size_bytes=4096, memory_bytes=256 * MIB),
    )
    assert p.housekeeping_pus == ()
    assert set(p.emulator_pus) == set(p.iothread_pus) == set(p.vcpu_pus()) == {0, 1}
    assert any("--housekeeping 0" in w for w in p.warnings)
    assert p.host_tuning == ()
