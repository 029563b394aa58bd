"""MPI across tuned VMs on two nodes: the example batch script, run under each batch
system hpcvm has (tests/sites.py): submitted with ``sbatch -N 2`` to the one-machine
Slurm test cluster (scripts/test-cluster.sh), and run on this machine with
``--batch local`` in a network namespace of its own; and the ways a job ends early,
the same cases under both.

Real parts throughout: real slurmctld and slurmd (one per node namespace) or hpcvm's
local steps, real QEMU (TCG) guests attached by taps to each node's bridge, real Open
MPI started over the guests' sshd. Oracles independent of hpcvm: the ranks' own report
(hostname and a token passed between them), the kernel's list of links in each node's
namespace, /proc for live QEMU processes, /proc/meminfo for huge pages, the kernel's
cpuset files and sysfs's core siblings for where VMs may run, and the batch system's own
job state.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cluster_support, sites
from tests.runtime_support import PAGE_2M, hugetlb_bytes_held_by_others
from tests.sites import Job, LocalSite, Site, SlurmSite, wait_until

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster
user_hpcvm = cluster_support.user_hpcvm

REPO = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO / "docs" / "examples" / "hpcvm-job.sh"
MPI_PING = REPO / "tests" / "cluster" / "mpi_ping.c"
HPCVM = str(Path(sys.executable).parent / "hpcvm")
RANK_LINE = re.compile(r"^rank=(\d+) size=(\d+) host=(\S+) netns=\S+ token=(-?\d+)$")


@pytest.fixture(scope="module", params=["slurm", "local"])
def site(request: pytest.FixtureRequest) -> Iterator[Site]:
    """Each batch system in turn (module scope: the Slurm cluster is made once)."""
    if request.param == "slurm":
        cluster = request.getfixturevalue("slurm_cluster")
        yield SlurmSite(cluster, str(request.getfixturevalue("user_hpcvm")))
        return
    with sites.local_namespace():
        local = LocalSite(HPCVM)
        try:
            yield local
        finally:
            local.close()


@pytest.fixture
def job_dir(site: Site) -> Iterator[Path]:
    with site.job_dir() as path:
        yield path


@pytest.fixture(scope="module")
def mpi_ping(site: Site) -> Iterator[Path]:
    """tests/cluster/mpi_ping.c built with mpicc, in a directory the site's jobs own
    and every guest sees (the job's working directory is shared with the guests)."""
    with site.job_dir() as path:
        exe = path / "mpi_ping"
        subprocess.run(["mpicc", "-O1", "-o", str(exe), str(MPI_PING)], check=True)
        exe.chmod(0o755)
        yield exe


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
        if state != "Z" and "qemu-system" in cmd and f"guest={name}-" in cmd:
            found.append(f"{proc.name}: {cmd[:120]}")
    return found


def job_processes(name: str) -> list[int]:
    """Pids of every process of cluster ``name``: its QEMUs (``guest=NAME-``) and the
    hpcvm processes whose environment holds its spec (node tasks, reapers)."""
    found = [int(line.split(":")[0]) for line in qemu_of(name)]
    spec = f'"name":"{name}"'.encode()
    return found + cluster_support.pids_with([b"hpcvm.cluster.internal"], [spec])


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def hugepages_free() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("HugePages_Free:"):
            return int(line.split()[1])
    return 0


def assert_nothing_left(site: Site, name: str, free_before: int) -> None:
    root = site.runtime_root()
    assert qemu_of(name) == []
    assert site.extra_links() == {}
    assert sorted(p.name for p in root.glob(f"{name}-*")) == []
    assert not (root / ".clusters" / name).exists()
    assert_hugepages_back(free_before)


def assert_hugepages_back(free_before: int, settle: float = 30.0) -> None:
    """Every huge page free again that was free before the job, but those a live process
    or a hugetlbfs file holds now: the job's QEMUs are gone (checked first), so these are
    other tests' guests (another xdist worker's, or other people's on this machine),
    never the job's. The kernel frees a dead QEMU's pages asynchronously: polled."""
    deadline = time.monotonic() + settle
    while True:
        missing = (free_before - hugepages_free()) * PAGE_2M
        held = hugetlb_bytes_held_by_others(set()) if missing > 0 else 0
        if missing <= held or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert missing <= held, f"{(missing - held) // 1024} kB of huge pages not freed"


def start(site: Site, job_dir: Path, name: str, *args: str) -> Job:
    return site.submit(JOB_SCRIPT, job_dir, site.job_env(name), *args)


def cores() -> int:
    """This machine's cores among the PUs this process may use (sysfs siblings)."""
    groups = set()
    for pu in os.sched_getaffinity(0):
        path = Path(f"/sys/devices/system/cpu/cpu{pu}/topology/thread_siblings_list")
        groups.add(path.read_text().strip() if path.exists() else str(pu))
    return len(groups)


def test_the_example_job_runs_mpi_ranks_in_a_vm_on_each_node(site: Site, mpi_ping: Path) -> None:
    free = hugepages_free()
    name = f"t{os.getpid()}"
    job = start(site, mpi_ping.parent, name, str(mpi_ping))
    code = site.wait(job)
    text = read(job.out) or "(no output file)"
    assert code == 0, f"{text}\n{site.diagnostics()}"
    ranks = [m.groups() for m in map(RANK_LINE.match, text.splitlines()) if m]
    node1, node2 = f"{site.node_prefix}1", f"{site.node_prefix}2"
    # One rank in each node's VM (hostnames are the VMs' names), and the token made the
    # round trip between them over the VM network.
    assert sorted((host, int(size), int(token)) for _, size, host, token in ranks) == [
        (f"{name}-{node1}", 2, 43),
        (f"{name}-{node2}", 2, 43),
    ], text
    # cluster ps: each node's VM ready at its deterministic address, pinned (hpc), and
    # planned on its own node: its vCPU on a PU of that node's own.
    pins, addresses = [], []
    for k, node in enumerate((node1, node2)):
        row = re.search(rf"{node}\s*│\s*{name}-{node}\s*│\s*ready\s*│\s*(\S+)\s*│\s*0->(\d+)", text)
        assert row is not None, text
        assert row.group(1) in site.expected_addresses()[k], (row.group(1), text)
        addresses.append(row.group(1))
        pins.append(int(row.group(2)))
        cpuset = cluster_support.node_cpuset(node) if site.batch == "slurm" else None
        if cpuset is not None:
            assert pins[-1] in cpuset[0], (node, cpuset, text)
    assert addresses[0] != addresses[1], text
    if site.batch == "local" and cores() >= 2:
        assert pins[0] != pins[1], f"both local nodes' VMs on PU {pins[0]}:\n{text}"
    assert f"{name}: down" in text
    assert_nothing_left(site, name, free)


def test_cancelling_the_job_takes_every_vm_down_on_every_node(site: Site, job_dir: Path) -> None:
    free = hugepages_free()
    name = f"c{os.getpid()}"
    job = start(site, job_dir, name, "sleep", "3600")
    root = site.runtime_root()
    try:
        wait_until("both VMs to run", lambda: len(qemu_of(name)) == 2)
        wait_until("the job to start its MPI run", lambda: "2 VM(s) up" in read(job.out))
        # No process of the job outside the job's cgroup: every QEMU, node task and
        # reaper of it, as the kernel lists their cgroups (Slurm's cgroup plugins).
        for pid in job_processes(name):
            outside = site.outside_job_cgroup(pid, job)
            assert not outside, f"pid {pid} ({outside}) is outside job {job.id}'s cgroup"
    finally:
        site.cancel(job)
    wait_until("the VMs to go", lambda: not qemu_of(name))
    wait_until("the run directories to go", lambda: not list(root.glob(f"{name}-*")))
    site.wait(job)
    wait_until("the state to go", lambda: not (root / ".clusters" / name).exists())
    assert_nothing_left(site, name, free)


def test_a_node_whose_vm_cannot_start_takes_the_whole_cluster_down(
    site: Site, job_dir: Path
) -> None:
    """A bridge that only node 1 has (on one machine: that no node has): a node's VM is
    refused before it starts, every VM already up is taken down, and the error names
    the node."""
    free = hugepages_free()
    name = f"f{os.getpid()}"
    with site.bridge_on_first_node_only("brt") as failing:
        # an explicit address: the bridge on node 1 has none to derive `auto` from
        env = site.job_env(
            name, HPCVM_NETWORK="bridge=brt", HPCVM_ADDRESS=f"{site.subnet_prefix}.101/24"
        )
        job = site.submit(JOB_SCRIPT, job_dir, env)
        code = site.wait(job)
    text = read(job.out)
    assert code != 0, text
    assert re.search(rf"error: node {failing}: .*brt", text), text
    assert_nothing_left(site, name, free)


def test_a_vm_that_dies_during_the_job_takes_the_others_down(site: Site, job_dir: Path) -> None:
    """node 2's QEMU is killed while the job's MPI program runs: node 2 reports it, the
    step ends node 1's task (Slurm's --kill-on-bad-exit), whose VM goes down too, and the
    job fails instead of hanging on a rank that will never answer."""
    free = hugepages_free()
    name = f"d{os.getpid()}"
    job = start(site, job_dir, name, "sleep", "3600")
    try:
        wait_until("the job to start its MPI run", lambda: "2 VM(s) up" in read(job.out))
        [victim] = [line for line in qemu_of(name) if f"{name}-{site.node_prefix}2" in line]
        os.kill(int(victim.split(":")[0]), 9)
        wait_until("the VMs to go", lambda: not qemu_of(name))
        site.wait(job)
    finally:
        site.cancel(job)
    assert site.ended_badly(job), read(job.out)
    assert_nothing_left(site, name, free)


def test_interrupting_cluster_up_takes_the_vms_already_started_down(
    site: Site, job_dir: Path
) -> None:
    """Ctrl-C (SIGINT to the job's processes) while `cluster up` waits for the nodes: it
    ends the holder step itself, so no VM outlives the interrupted command."""
    free = hugepages_free()
    name = f"i{os.getpid()}"
    job = start(site, job_dir, name)
    try:
        wait_until("a VM to start", lambda: len(qemu_of(name)) >= 1)
        site.interrupt(job)
        wait_until("the VMs to go", lambda: not qemu_of(name))
        site.wait(job)
    finally:
        site.cancel(job)
    assert "interrupted" in read(job.out), read(job.out)
    assert_nothing_left(site, name, free)


def node_tasks(name: str) -> list[int]:
    """Pids of the holder step's tasks (a node's VM) of cluster ``name``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        # exactly `python -m hpcvm.cluster.internal node`: srun and the holder carry
        # that line as their last words, and the same spec in their environment
        task = cmd[1:] == [b"-m", b"hpcvm.cluster.internal", b"node", b""]
        if task and f'"name":"{name}"'.encode() in environ:
            found.append(int(proc.name))
    return found


def test_a_node_task_killed_outright_still_leaves_no_vm(site: Site, job_dir: Path) -> None:
    """SIGKILL of node 2's task (as Slurm's KillWait or the OOM killer would): its reaper
    takes its VM down, the step ends the other task, whose VM goes down too."""
    free = hugepages_free()
    name = f"k{os.getpid()}"
    job = start(site, job_dir, name, "sleep", "3600")
    try:
        wait_until("the job to start its MPI run", lambda: "2 VM(s) up" in read(job.out))
        tasks = node_tasks(name)
        assert len(tasks) == 2, tasks
        os.kill(sorted(tasks)[1], 9)
        wait_until("the VMs to go", lambda: not qemu_of(name))
        site.wait(job)
    finally:
        site.cancel(job)
    assert_nothing_left(site, name, free)


def test_two_jobs_at_once_each_run_mpi_across_their_own_vms(site: Site, mpi_ping: Path) -> None:
    """Two jobs started together on the default addresses (``--address auto``): under
    Slurm on nodes 1-2 and 3-4 of the four-node test cluster, locally both on this one
    host. Each job's ranks meet only its own VMs, and no address is given twice."""
    free = hugepages_free()
    names = [f"a{os.getpid()}", f"b{os.getpid()}"]
    with site.job_dir() as first, site.job_dir() as second:  # each job its own output
        for where in (first, second):  # the guests see the job's directory, not another
            shutil.copy2(mpi_ping, where / mpi_ping.name)
        jobs = [
            start(site, where, name, str(where / mpi_ping.name))
            for where, name in zip((first, second), names, strict=True)
        ]
        for job in jobs:
            site.wait(job)
        outputs = [read(job.out) for job in jobs]
    addresses: list[str] = []
    for name, job, text in zip(names, jobs, outputs, strict=True):
        assert job.returncode == 0, f"{text}\n{site.diagnostics()}"
        ranks = [m.groups() for m in map(RANK_LINE.match, text.splitlines()) if m]
        hosts = sorted(host for _, _, host, _ in ranks)
        assert len(hosts) == 2 and all(h.startswith(f"{name}-") for h in hosts), text
        assert len(set(hosts)) == 2 and {t for *_, t in ranks} == {"43"}, text
        addresses += re.findall(rf"{name}-\S+\s*│\s*ready\s*│\s*(\S+)", text)
    assert len(addresses) == 4 and len(set(addresses)) == 4, addresses
    for name in names:
        assert_nothing_left(site, name, free)
