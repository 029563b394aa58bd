"""Native runs where the VM runs (issue 9): the default native placement is the tuned
VM's vCPU PUs and memory nodes, enforced with a real kernel cpuset that Open MPI's own
binding honours, and the noise suite's work is fixed once per bench run. A process that
may not make a cpuset (a site's user, issue 36) gets the same PUs and nodes by CPU
affinity and a bound memory policy, mpirun's ranks included. Checked with what the
kernel says (/proc/self/status of the benchmark process, get_mempolicy through
``numactl --show``, a cpuset made as that user), not with hpcvm."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpcvm.bench.core.launch import mpirun_argv
from hpcvm.bench.envs.cpuset import CGROUP_ROOT, PREFIX, probe
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.session import prepare
from hpcvm.bench.suites.noise.suite import NoiseSuite
from hpcvm.bench.suites.registry import SuiteOptions
from hpcvm.host import discover
from tests import cluster_support

pytestmark = pytest.mark.integration

STATUS = ["/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"]


def _cpusets() -> list[Path]:
    """This test process's native cpusets (their names hold its pid: another bench on
    the machine, a developer's or a parallel run's, has its own)."""
    return [p for p in CGROUP_ROOT.rglob(f"{PREFIX}{os.getpid()}-*") if p.is_dir()]


def _last_cpu() -> int:
    return max(os.sched_getaffinity(0))


def test_a_native_run_and_its_mpi_ranks_stay_on_the_given_pu(tmp_path: Path) -> None:
    cpu = _last_cpu()
    env = NativeEnvironment(discover(), cpus=[cpu], mems=[0])
    env.start()
    try:
        plain = env.run(STATUS, tmp_path, 60)
        assert plain.stdout.split() == ["Cpus_allowed_list:", str(cpu)], plain.stderr
        ranked = env.run(mpirun_argv(1, STATUS), tmp_path, 120)
        assert ranked.exit_code == 0, ranked.stderr
        assert ranked.stdout.split() == ["Cpus_allowed_list:", str(cpu)], ranked.stderr
        if len(os.sched_getaffinity(0)) > 1:  # a second rank does not fit one PU
            refused = env.run(mpirun_argv(2, ["/bin/true"]), tmp_path, 120)
            assert refused.exit_code != 0
    finally:
        env.close()
    assert _cpusets() == []


def test_default_native_placement_is_the_tuned_vms_and_noise_work_is_fixed(
    tmp_path: Path,
) -> None:
    host = discover()
    config = BenchConfig(
        envs=("native", "vm:naive", "vm:hpc"),
        suites=("noise",),
        suite_options=SuiteOptions(noise_quanta=100),
    )
    prep = prepare(config, tmp_path / "r", host=host)
    hpc = prep.envs["vm:hpc"]
    assert prep.native is not None
    assert prep.native.cpus == hpc.plan.vcpu_pus()  # type: ignore[attr-defined]
    native = prep.envs["native"]
    assert native.vcpus == hpc.vcpus
    [noise] = prep.suites
    assert isinstance(noise, NoiseSuite) and noise.iterations is not None
    assert prep.config.suite_options.given("noise_iterations") == noise.iterations
    assert "-i" in noise.prepare(tmp_path, 1, 0)
    assert not (tmp_path / "r").exists()  # prepare starts and writes nothing


def _numactl_show(text: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def test_without_a_cpuset_runs_and_mpi_ranks_keep_to_the_pu_by_affinity(tmp_path: Path) -> None:
    cpu = _last_cpu()
    before = _cpusets()
    env = NativeEnvironment(discover(), cpus=[cpu], mems=[0], confine="affinity")
    env.start()
    try:
        assert _cpusets() == before  # no cgroup is made this way
        plain = env.run(STATUS, tmp_path, 60)
        assert plain.stdout.split() == ["Cpus_allowed_list:", str(cpu)], plain.stderr
        ranked = env.run(mpirun_argv(1, STATUS), tmp_path, 120)
        assert ranked.exit_code == 0, ranked.stderr
        assert ranked.stdout.split() == ["Cpus_allowed_list:", str(cpu)], ranked.stderr
        policy = _numactl_show(env.run(["numactl", "--show"], tmp_path, 60).stdout)
        assert policy["policy"] == "bind" and policy["membind"].split() == ["0"], policy
        assert policy["physcpubind"].split() == [str(cpu)], policy
        in_mpi = _numactl_show(env.run(mpirun_argv(1, ["numactl", "--show"]), tmp_path, 120).stdout)
        assert in_mpi["policy"] == "bind" and in_mpi["membind"].split() == ["0"], in_mpi
    finally:
        env.close()


def test_a_user_is_denied_a_cpuset_and_the_bench_confines_by_affinity_instead(
    tmp_path: Path,
) -> None:
    """The probe's two answers from the kernel itself: root makes (and removes) a real
    cpuset; the unprivileged test user is refused one, and prepare then records affinity."""
    assert probe([_last_cpu()], [0]) is True
    assert _cpusets() == []
    code = (
        "from hpcvm.bench.envs.cpuset import probe; import os; "
        "print(probe([max(os.sched_getaffinity(0))], [0]))"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    readable = cluster_support.as_user(["test", "-r", f"{src}/hpcvm/__init__.py"])
    if readable.returncode != 0:
        pytest.skip(f"the test user cannot read {src}")
    as_user = subprocess.run(
        ["runuser", "-u", cluster_support.TEST_USER, "--", "env", f"PYTHONPATH={src}",
         "/usr/bin/python3", "-c", code],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert as_user.returncode == 0, as_user.stderr
    assert as_user.stdout.split() == ["False"]
    assert _cpusets() == []
