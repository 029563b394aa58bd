"""A VM bigger than the batch job's memory is refused before it starts (issue 25), not
OOM-killed midway: this process's cgroup memory limit, read from the kernel's cgroup
files (v1 ``hierarchical_memory_limit``, v2 ``memory.max`` up the tree), and the plan's
charge against it: QEMU's own memory always, guest RAM on 4K pages, not on huge pages
(no hugetlb limit). The live reading is also checked against a real cgroup in
tests/integration/test_cluster_infra.py's jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.errors import InfeasiblePlanError
from hpcvm.host import sysfs
from hpcvm.plan import plan
from hpcvm.plan.memory import qemu_overhead
from hpcvm.plan.model import PlanRequest
from hpcvm.units import GIB, MIB
from tests.plan_checks import roomy, synthetic_host


def _v1_root(tmp: Path, limit: int) -> Path:
    (tmp / "proc" / "self").mkdir(parents=True)
    (tmp / "proc" / "self" / "cgroup").write_text(
        "9:cpuset:/slurm_node1/uid_2390/job_7\n4:memory:/slurm_node1/uid_2390/job_7/step_0\n"
    )
    leaf = tmp / "sys/fs/cgroup/memory/slurm_node1/uid_2390/job_7/step_0"
    leaf.mkdir(parents=True)
    (leaf / "memory.stat").write_text(f"cache 0\nhierarchical_memory_limit {limit}\nrss 1\n")
    return tmp


def test_cgroup_v1_limit_is_the_hierarchical_one(tmp_path: Path) -> None:
    assert sysfs.memory_limit(_v1_root(tmp_path / "a", 200 * MIB)) == 200 * MIB
    assert sysfs.memory_limit(_v1_root(tmp_path / "b", 9223372036854771712)) is None


def test_cgroup_v2_limit_is_the_smallest_up_the_tree(tmp_path: Path) -> None:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/jobs/job7/step0\n")
    base = tmp_path / "sys/fs/cgroup"
    for rel, value in (("jobs", "max"), ("jobs/job7", str(GIB)), ("jobs/job7/step0", "max")):
        (base / rel).mkdir(parents=True, exist_ok=True)
        (base / rel / "memory.max").write_text(value + "\n")
    assert sysfs.memory_limit(tmp_path) == GIB


def test_no_cgroup_file_means_no_limit(tmp_path: Path) -> None:
    assert sysfs.memory_limit(tmp_path) is None


def _request(profile: str, memory: int) -> PlanRequest:
    return PlanRequest(profile=profile, vcpus=1, memory_bytes=memory, accel="tcg")  # type: ignore[arg-type]


def test_a_vm_beyond_the_jobs_memory_is_refused_naming_the_batch_option() -> None:
    host = roomy(synthetic_host("pack:1 numa:1 core:4 pu:1")).model_copy(
        update={"memory_limit": 700 * MIB}
    )
    with pytest.raises(InfeasiblePlanError) as info:
        plan(host, _request("naive", 512 * MIB))
    text = str(info.value)
    assert "#SBATCH --mem" in text and info.value.cause == "memory-limit"
    named = int(text.split("use --memory ")[1].split("M")[0])
    assert named * MIB + qemu_overhead(named * MIB, "tcg") <= 700 * MIB  # what it names fits
    plan(host, _request("naive", named * MIB))
    # on huge pages only QEMU's own memory is charged: the same guest plans
    plan(host, _request("hugepages", 512 * MIB))
    tight = host.model_copy(update={"memory_limit": qemu_overhead(512 * MIB, "tcg") - MIB})
    with pytest.raises(InfeasiblePlanError, match="#SBATCH --mem"):
        plan(tight, _request("hugepages", 512 * MIB))


def test_bench_vms_that_fit_alone_but_not_held_together_are_refused() -> None:
    """bench keeps every environment's VM up (paused) at once: each within the job's
    memory alone, all of them beyond it, is refused before any starts (a 4K-page VM
    was OOM-killed midway on the Slurm test cluster before this check)."""
    from hpcvm.bench.run.config import BenchConfig
    from hpcvm.bench.run.session import vm_plans

    one = 640 * MIB
    small_pages = one + qemu_overhead(one)  # vm:hpc+page=4K: RAM and QEMU charged
    huge = qemu_overhead(one)  # vm:hpc: QEMU's own memory only
    config = BenchConfig(
        envs=("native", "vm:hpc", "vm:hpc+page=4K"), suites=("hpcc",), vm_memory=one
    )
    host = roomy(synthetic_host("pack:1 numa:1 core:4 pu:1"))
    alone = host.model_copy(update={"memory_limit": small_pages + MIB})
    for env in ("vm:hpc", "vm:hpc+page=4K"):
        vm_plans(config.model_copy(update={"envs": ("native", env)}), alone)
    with pytest.raises(InfeasiblePlanError, match="held at once") as info:
        vm_plans(config, alone)
    assert "#SBATCH --mem" in str(info.value) and info.value.cause == "memory-limit"
    enough = host.model_copy(update={"memory_limit": small_pages + huge})
    assert sorted(vm_plans(config, enough)) == ["vm:hpc", "vm:hpc+page=4K"]


def test_the_memory_check_counts_qemus_overhead_for_the_accelerator_in_use() -> None:
    """TCG's QEMU holds its translated code beside what KVM's holds (plan/memory.py's
    measured figures): a job's memory that holds a KVM guest's QEMU but not a TCG one's
    plans under KVM and is refused under TCG, before anything starts; the plan's notes
    say which overhead was counted."""
    one = 512 * MIB
    kvm, tcg = qemu_overhead(one, "kvm"), qemu_overhead(one, "tcg")
    assert tcg - kvm >= 256 * MIB  # TCG measured at 293 MiB for this guest: over KVM's 261M
    assert tcg >= 293 * MIB
    base = roomy(synthetic_host("pack:1 numa:1 core:4 pu:1"))
    usable = base.kvm.model_copy(update={"usable": True, "reason": "test: KVM usable"})
    host = base.model_copy(update={"memory_limit": kvm + MIB, "kvm": usable})
    for profile in ("hugepages", "numa"):
        request = _request(profile, one)
        plan(host, request.model_copy(update={"accel": "kvm"}))
        plan(host, request.model_copy(update={"accel": "auto"}))  # KVM usable: KVM's figure
        # --accel tcg on a host where KVM is usable: TCG's QEMU, so TCG's figure
        with pytest.raises(InfeasiblePlanError, match="#SBATCH --mem"):
            plan(host, request.model_copy(update={"accel": "tcg"}))
    # a host where KVM is not usable plans TCG under --accel auto, and counts TCG's
    tcg_host = base.model_copy(update={"memory_limit": kvm + MIB})
    with pytest.raises(InfeasiblePlanError, match="#SBATCH --mem"):
        plan(tcg_host, _request("hugepages", one).model_copy(update={"accel": "auto"}))
    enough = tcg_host.model_copy(update={"memory_limit": tcg})
    done = plan(enough, _request("hugepages", one).model_copy(update={"accel": "auto"}))
    assert done.accel == "tcg"
