"""MPI across tuned VMs on two Slurm nodes: the example batch script, submitted with
``sbatch -N 2`` to the one-machine test cluster (scripts/test-cluster.sh), and the
ways a job ends early.

Real parts throughout: real slurmctld and slurmd (one per node namespace), real QEMU
(TCG) guests attached by taps to each node's bridge, real Open MPI started over the
guests' sshd. Oracles independent of hpcvm: the ranks' own report (hostname and a
token passed between them), the kernel's list of links in each node's namespace,
/proc for live QEMU processes, /proc/meminfo for huge pages, and Slurm's own job state.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpcvm.runtime import paths
from tests import cluster_support
from tests.cluster_support import LocalCluster

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster

REPO = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO / "docs" / "examples" / "hpcvm-job.sh"
MPI_PING = REPO / "tests" / "cluster" / "mpi_ping.c"
HPCVM = str(Path(sys.executable).parent / "hpcvm")
JOB_TIMEOUT = 420.0  # two TCG guests on a loaded 2-core machine; a bound on a hang
RANK_LINE = re.compile(r"^rank=(\d+) size=(\d+) host=(\S+) netns=\S+ token=(-?\d+)$")
NODE_LINKS = {"lo", "up0", "br0"}  # what scripts/test-cluster.sh puts in a node


def job_env(name: str, **extra: str) -> dict[str, str]:
    """The example script's settings for the test cluster: 1 vCPU and 256 MiB per VM
    (the CI budget), addresses from .101 on the nodes' /24, TCG (no VT-x here), and no
    housekeeping core (each node of the cluster may have a single PU)."""
    return {
        "HPCVM": HPCVM,
        "HPCVM_NAME": name,
        "HPCVM_MEMORY": "256M",
        "HPCVM_ADDRESS": "10.77.0.101/24",
        "HPCVM_UP_OPTIONS": "--accel tcg --housekeeping 0",
        **extra,
    }


def readable_dir() -> Path:
    """A job directory QEMU's unprivileged user can read (pytest's tmp_path is 0700
    root's, which ``cluster up`` refuses: the guests see the job's directory)."""
    path = Path(tempfile.mkdtemp(prefix="hpcvm-cluster-test-", dir="/var/tmp"))
    path.chmod(0o755)
    return path


@pytest.fixture
def job_dir() -> Iterator[Path]:
    path = readable_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def mpi_ping() -> Iterator[Path]:
    """tests/cluster/mpi_ping.c built with mpicc, in a directory every guest sees (the
    job's working directory is shared with the guests at the same path)."""
    path = readable_dir()
    exe = path / "mpi_ping"
    subprocess.run(["mpicc", "-O1", "-o", str(exe), str(MPI_PING)], check=True)
    yield exe
    shutil.rmtree(path, ignore_errors=True)


def sbatch(
    cluster: LocalCluster, workdir: Path, env: dict[str, str], *args: str, wait: bool = True
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Submit the example script with ``sbatch -N 2``; its output file."""
    out = workdir / "job.out"
    argv = ["sbatch", "-N", "2", f"--chdir={workdir}", f"--output={out}"]
    argv += ["--wait"] if wait else ["--parsable"]
    proc = cluster.run([*argv, str(JOB_SCRIPT), *args], env=env, timeout=JOB_TIMEOUT, check=False)
    return proc, out


def qemu_of(name: str) -> list[str]:
    """Live QEMU processes of cluster ``name`` (its VMs are named ``name-<node>``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and "qemu-system" in cmd and f"{name}-node" in cmd:
            found.append(f"{proc.name}: {cmd[:120]}")
    return found


def extra_links(cluster: LocalCluster) -> dict[str, list[str]]:
    """Links in each node's namespace beyond the test cluster's own (taps left over)."""
    out = {}
    for node in cluster.nodes:
        text = subprocess.run(
            ["ip", "-n", node.namespace, "-o", "link"], capture_output=True, text=True, check=True
        ).stdout
        names = {line.split(":")[1].strip().split("@")[0] for line in text.splitlines()}
        if names - NODE_LINKS:
            out[node.name] = sorted(names - NODE_LINKS)
    return out


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def hugepages_free() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("HugePages_Free:"):
            return int(line.split()[1])
    return 0


def assert_nothing_left(cluster: LocalCluster, name: str, free_before: int) -> None:
    root = paths.runtime_root()
    assert qemu_of(name) == []
    assert extra_links(cluster) == {}
    assert sorted(p.name for p in root.glob(f"{name}-*")) == []
    assert not (root / ".clusters" / name).exists()
    assert hugepages_free() == free_before


def wait_until(what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def submit_detached(
    cluster: LocalCluster, job_dir: Path, name: str, *args: str
) -> tuple[str, Path]:
    """Submit the example script without waiting: the job id and its output file."""
    proc, out = sbatch(cluster, job_dir, job_env(name), *args, wait=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0], out


def wait_job_gone(cluster: LocalCluster, job: str) -> None:
    wait_until(
        "Slurm to end the job",
        lambda: not cluster.run(["squeue", "-h", "-j", job], check=False).stdout.strip(),
    )


def test_the_example_job_runs_mpi_ranks_in_a_vm_on_each_node(
    slurm_cluster: LocalCluster, mpi_ping: Path
) -> None:
    free = hugepages_free()
    name = f"t{os.getpid()}"
    proc, out = sbatch(slurm_cluster, mpi_ping.parent, job_env(name), str(mpi_ping))
    text = out.read_text() if out.exists() else "(no output file)"
    assert proc.returncode == 0, f"{proc.stderr}\n{text}\n{slurm_cluster.log_tails()}"
    ranks = [m.groups() for m in map(RANK_LINE.match, text.splitlines()) if m]
    # One rank in each node's VM (hostnames are the VMs' names), and the token made the
    # round trip between them over the VM network.
    assert sorted((host, int(size), int(token)) for _, size, host, token in ranks) == [
        (f"{name}-node1", 2, 43),
        (f"{name}-node2", 2, 43),
    ], text
    # cluster ps: each node's VM ready at its deterministic address, pinned (hpc), and
    # planned on its own node: its vCPU on the PU that node's cpuset holds.
    for k, node in enumerate(("node1", "node2")):
        row = re.search(rf"{node}\s*│\s*{name}-{node}\s*│\s*ready\s*│\s*(\S+)\s*│\s*0->(\d+)", text)
        assert row is not None, text
        assert row.group(1) == f"10.77.0.{101 + k}/24"
        cpuset = cluster_support.node_cpuset(node)
        if cpuset is not None:
            assert int(row.group(2)) in cpuset[0], (node, cpuset, text)
    assert f"{name}: down" in text
    assert_nothing_left(slurm_cluster, name, free)


def test_scancel_takes_every_vm_down_on_every_node(
    slurm_cluster: LocalCluster, job_dir: Path
) -> None:
    free = hugepages_free()
    name = f"c{os.getpid()}"
    job, out = submit_detached(slurm_cluster, job_dir, name, "sleep", "3600")
    root = paths.runtime_root()
    try:
        wait_until("both VMs to run", lambda: len(qemu_of(name)) == 2)
        wait_until(
            "the job to start its MPI run",
            lambda: "2 VM(s) up" in read(out),
        )
    finally:
        slurm_cluster.run(["scancel", job])
    wait_until("the VMs to go", lambda: not qemu_of(name))
    wait_until("the run directories to go", lambda: not list(root.glob(f"{name}-*")))
    wait_job_gone(slurm_cluster, job)
    assert_nothing_left(slurm_cluster, name, free)


def test_a_node_whose_vm_cannot_start_takes_the_whole_cluster_down(
    slurm_cluster: LocalCluster, job_dir: Path
) -> None:
    """A bridge that exists on node1 only: node2's VM is refused before it starts, and
    node1's VM, already up, is taken down; the error names node2."""
    free = hugepages_free()
    name = f"f{os.getpid()}"
    ns1 = slurm_cluster.nodes[0].namespace
    subprocess.run(["ip", "-n", ns1, "link", "add", "brt", "type", "bridge"], check=True)
    try:
        env = job_env(name, HPCVM_NETWORK="bridge=brt")
        proc, out = sbatch(slurm_cluster, job_dir, env)
        text = out.read_text() if out.exists() else ""
    finally:
        subprocess.run(["ip", "-n", ns1, "link", "del", "brt"], check=False)
    assert proc.returncode != 0, text
    assert re.search(r"error: node node2: .*brt", text), text
    assert_nothing_left(slurm_cluster, name, free)


def test_a_vm_that_dies_during_the_job_takes_the_others_down(
    slurm_cluster: LocalCluster, job_dir: Path
) -> None:
    """node2's QEMU is killed while the job's MPI program runs: node2 reports it,
    srun's --kill-on-bad-exit ends node1's task, whose VM goes down too, and the job
    fails instead of hanging on a rank that will never answer."""
    free = hugepages_free()
    name = f"d{os.getpid()}"
    job, out = submit_detached(slurm_cluster, job_dir, name, "sleep", "3600")
    try:
        wait_until("the job to start its MPI run", lambda: "2 VM(s) up" in read(out))
        [victim] = [line for line in qemu_of(name) if f"{name}-node2" in line]
        os.kill(int(victim.split(":")[0]), 9)
        wait_until("the VMs to go", lambda: not qemu_of(name))
        wait_job_gone(slurm_cluster, job)
    finally:
        slurm_cluster.run(["scancel", job], check=False)
    state = slurm_cluster.run(["scontrol", "show", "job", job], check=False).stdout
    # Slurm keeps an ended job's record for MinJobAge (30 s here): it says how it ended.
    assert re.search(r"JobState=(FAILED|CANCELLED)", state), state
    assert_nothing_left(slurm_cluster, name, free)


def test_interrupting_cluster_up_takes_the_vms_already_started_down(
    slurm_cluster: LocalCluster, job_dir: Path
) -> None:
    """Ctrl-C (SIGINT to the batch step's processes) while `cluster up` waits for the
    nodes: it ends the holder step itself, so no VM outlives the interrupted command."""
    free = hugepages_free()
    name = f"i{os.getpid()}"
    job, out = submit_detached(slurm_cluster, job_dir, name)
    try:
        wait_until("a VM to start", lambda: len(qemu_of(name)) >= 1)
        slurm_cluster.run(["scancel", "--batch", "--full", "--signal=INT", job])
        wait_until("the VMs to go", lambda: not qemu_of(name))
        wait_job_gone(slurm_cluster, job)
    finally:
        slurm_cluster.run(["scancel", job], check=False)
    assert "interrupted" in read(out), read(out)
    assert_nothing_left(slurm_cluster, name, free)


def node_tasks(name: str) -> list[int]:
    """Pids of the holder step's tasks (``hpcvm cluster node``) of cluster ``name``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        # exactly `python -m hpcvm.cli.main cluster node`: srun and the holder's launcher
        # carry that line as their last words, and the same spec in their environment
        task = cmd[1:] == [b"-m", b"hpcvm.cli.main", b"cluster", b"node", b""]
        if task and f'"name":"{name}"'.encode() in environ:
            found.append(int(proc.name))
    return found


def test_a_node_task_killed_outright_still_leaves_no_vm(
    slurm_cluster: LocalCluster, job_dir: Path
) -> None:
    """SIGKILL of node2's task (as Slurm's KillWait or the OOM killer would): its reaper
    takes its VM down, srun ends the other task, whose VM goes down too."""
    free = hugepages_free()
    name = f"k{os.getpid()}"
    job, out = submit_detached(slurm_cluster, job_dir, name, "sleep", "3600")
    try:
        wait_until("the job to start its MPI run", lambda: "2 VM(s) up" in read(out))
        tasks = node_tasks(name)
        assert len(tasks) == 2, tasks
        os.kill(tasks[1], 9)
        wait_until("the VMs to go", lambda: not qemu_of(name))
        wait_job_gone(slurm_cluster, job)
    finally:
        slurm_cluster.run(["scancel", job], check=False)
    assert_nothing_left(slurm_cluster, name, free)
