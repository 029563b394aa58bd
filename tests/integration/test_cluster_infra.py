"""The one-machine Slurm test cluster works with real parts (scripts/test-cluster.sh).

Real slurmctld, slurmd (one per simulated node, each in its own network namespace) and
munged, real Open MPI. The oracles are the kernel's own view, read from the host side:
the inode of each namespace's /run/netns entry, the address ``ip -n`` shows on the
node's bridge, and the processes in /proc, never what the script says about itself.
The last test takes the cluster down, checks that nothing of it remains, checks that an
``up`` failing halfway leaves nothing either, and brings the cluster back up.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import cluster_support
from tests.cluster_support import LocalCluster

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster

MPI_PING = Path(__file__).resolve().parent.parent / "cluster" / "mpi_ping.c"
JOB_TIMEOUT = 120.0  # a loaded 2-core machine; these jobs take about a second idle
TASK_LINE = re.compile(r"^task node=(\S+) host=(\S+) netns=net:\[(\d+)\] addr=(\S+)$")
RANK_LINE = re.compile(r"^rank=(\d+) size=(\d+) host=(\S+) netns=net:\[(\d+)\] token=(-?\d+)$")


def namespace_inode(namespace: str) -> int:
    """The network namespace's identity as the kernel gives it (the nsfs inode)."""
    return os.stat(f"/run/netns/{namespace}").st_ino


def bridge_address(namespace: str, bridge: str) -> str:
    """The IPv4 address (with prefix) on ``bridge`` inside ``namespace``, read by ip."""
    out = subprocess.run(
        ["ip", "-n", namespace, "-o", "-4", "addr", "show", "dev", bridge],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[out.index("inet") + 1]


def submit(cluster: LocalCluster, workdir: Path, body: str) -> str:
    """Submit a batch script with ``sbatch -N <all nodes> --wait`` and return its
    output file's text; fail with the output and logs if the job fails."""
    batch = workdir / "job.sh"
    batch.write_text("#!/bin/sh\nset -e\n" + body)
    out = workdir / "job.out"
    nodes = str(len(cluster.nodes))
    proc = cluster.run(
        ["sbatch", "-N", nodes, "--wait", f"--chdir={workdir}", f"--output={out}", str(batch)],
        env=cluster.mpi_env(),
        timeout=JOB_TIMEOUT,
        check=False,
    )
    text = out.read_text() if out.exists() else "(no output file)"
    if proc.returncode != 0:
        pytest.fail(
            f"batch job failed ({proc.returncode}): {proc.stderr}\njob output:\n{text}\n"
            f"{cluster.log_tails()}"
        )
    return text


def test_sinfo_shows_every_node_idle_at_its_namespace_address(slurm_cluster: LocalCluster) -> None:
    proc = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N %T %o"])
    rows = {tuple(line.split()) for line in proc.stdout.splitlines() if line.strip()}
    expected = {
        (node.name, "idle", bridge_address(node.namespace, node.bridge).split("/")[0])
        for node in slurm_cluster.nodes
    }
    assert rows == expected


def test_batch_tasks_run_in_their_own_nodes_namespace(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    task = tmp_path / "task.sh"
    task.write_text(
        "#!/bin/sh\n"
        "set -- $(ip -o -4 addr show dev br0)\n"  # 2: br0 inet ADDR/PREFIX ...
        'echo "task node=$SLURMD_NODENAME host=$(hostname)'
        ' netns=$(readlink /proc/self/ns/net) addr=$4"\n'
    )
    body = f"srun --ntasks-per-node=1 sh {task}\n"
    text = submit(slurm_cluster, tmp_path, body)
    tasks = [m.groups() for m in map(TASK_LINE.match, text.splitlines()) if m]
    seen = {node: (host, int(inode), addr) for node, host, inode, addr in tasks}
    assert len(tasks) == len(slurm_cluster.nodes), text
    assert seen == {
        node.name: (
            node.name,
            namespace_inode(node.namespace),
            bridge_address(node.namespace, node.bridge),
        )
        for node in slurm_cluster.nodes
    }
    assert os.stat("/proc/self/ns/net").st_ino not in {inode for _, inode, _ in seen.values()}


def test_each_nodes_tasks_run_on_that_nodes_own_pus(slurm_cluster: LocalCluster) -> None:
    """Each node is a cpuset of its own (where the machine has one to give): a task's
    allowed CPUs, as the kernel reports them, are its node's, and two nodes' differ."""
    if cluster_support.node_cpuset("node1") is None:
        pytest.skip("no cpuset cgroups on this machine: the nodes share every PU")
    report = "echo $(hostname) $(grep Cpus_allowed_list /proc/self/status)"
    out = slurm_cluster.run(["srun", "-N", "2", "sh", "-c", report]).stdout
    seen = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.strip()}
    assert sorted(seen) == ["node1", "node2"], out
    for node, allowed in seen.items():
        cpuset = cluster_support.node_cpuset(node)
        assert cpuset is not None
        assert cluster_support.expand_list(allowed) == cpuset[0], (node, out)
    if len(os.sched_getaffinity(0)) >= 2:
        assert seen["node1"] != seen["node2"], out


def test_run_on_a_node_runs_in_that_nodes_namespace(slurm_cluster: LocalCluster) -> None:
    for node in slurm_cluster.nodes:
        out = slurm_cluster.run(
            ["sh", "-c", "hostname; stat -L -c %i /proc/self/ns/net"], node=node.name
        )
        assert out.stdout.split() == [node.name, str(namespace_inode(node.namespace))]


@pytest.fixture(scope="module")
def mpi_ping(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/cluster/mpi_ping.c built with Open MPI's mpicc (the nodes share the file
    system, as cluster nodes share a home directory)."""
    if shutil.which("mpicc") is None:
        pytest.skip(f"mpicc (libopenmpi-dev) is missing; {cluster_support.INSTALL_HINT}")
    exe = tmp_path_factory.mktemp("mpi") / "mpi_ping"
    subprocess.run(["mpicc", "-O1", "-o", str(exe), str(MPI_PING)], check=True)
    return exe


def assert_one_rank_per_node(cluster: LocalCluster, text: str) -> None:
    """Two ranks, each on its own node, in that node's namespace, and the token made the
    round trip (42 sent, 43 back): the ranks talked over the cluster's TCP network."""
    ranks = [m.groups() for m in map(RANK_LINE.match, text.splitlines()) if m]
    assert len(ranks) == 2, text
    by_host = {host: (int(size), int(inode), int(token)) for _, size, host, inode, token in ranks}
    assert by_host == {
        node.name: (2, namespace_inode(node.namespace), 43) for node in cluster.nodes[:2]
    }


# Launch paths: srun starts the ranks itself and wires them up through Slurm's PMIx
# plugin; mpirun starts its own daemons (orted) on the nodes through srun (plm slurm).
LAUNCHERS = {
    "srun-pmix": "srun --mpi=pmix -N 2 --ntasks-per-node=1 {exe}\n",
    "mpirun-plm-slurm": "mpirun --mca plm slurm -np 2 --map-by node {exe}\n",
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_mpi_across_two_nodes(
    slurm_cluster: LocalCluster, mpi_ping: Path, tmp_path: Path, launcher: str
) -> None:
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("needs two nodes")
    text = submit(slurm_cluster, tmp_path, LAUNCHERS[launcher].format(exe=mpi_ping))
    assert_one_rank_per_node(slurm_cluster, text)


def namespaces_running(program: str, arg: str, inodes: set[int]) -> set[int]:
    """The namespaces (of ``inodes``) that hold a live ``program arg`` process (srun
    starts it by its full path)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
            inode = os.stat(proc / "ns" / "net").st_ino
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if Path(argv[0]).name == program and argv[1:2] == [arg] and inode in inodes:
            found.add(inode)
    return found


def wait_until(what: str, predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after JOB_TIMEOUT (a bound on
    a hang, not a timing assertion)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_scancel_stops_the_jobs_tasks_on_every_node(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    """proctrack/pgid is what finds a job's processes here: scancel must reach the
    tasks in every node's namespace."""
    seconds = str(3000 + os.getpid() % 1000)  # marks this test's tasks
    batch = tmp_path / "long.sh"
    batch.write_text(f"#!/bin/sh\nsrun --ntasks-per-node=1 sleep {seconds}\n")
    nodes = len(slurm_cluster.nodes)
    job = slurm_cluster.run(
        ["sbatch", "--parsable", "-N", str(nodes), f"--chdir={tmp_path}", str(batch)]
    ).stdout.strip()
    inodes = {namespace_inode(node.namespace) for node in slurm_cluster.nodes}
    try:
        wait_until(
            "the tasks to start",
            lambda: namespaces_running("sleep", seconds, inodes) == inodes,
        )
    finally:
        slurm_cluster.run(["scancel", job.split(";")[0]])
    wait_until(
        "scancel to stop the tasks", lambda: not namespaces_running("sleep", seconds, inodes)
    )


def cluster_processes(inodes: set[int]) -> list[str]:
    """Live (non-zombie) processes that belong to the test cluster: in one of its
    namespaces, or naming its state directory on their command line."""
    found = []
    state_dir = str(cluster_support.STATE_DIR)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            inode = os.stat(proc / "ns" / "net").st_ino
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state != "Z" and (inode in inodes or state_dir in cmdline):
            found.append(f"{proc.name}: {cmdline.strip()}")
    return found


def root_addresses_in(subnet: str) -> list[str]:
    """Addresses in the test subnet on the host's own interfaces (there must be none)."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    prefix = subnet.rsplit(".", 1)[0] + "."
    return [line for line in out.splitlines() if f"inet {prefix}" in line]


def our_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    pattern = re.compile(
        rf"^({cluster_support.SWITCH_NAMESPACE}|{cluster_support.NODE_NAMESPACE_PREFIX}\d+)$"
    )
    return [n for n in names if pattern.match(n)]


def assert_nothing_left(inodes: set[int], subnet: str) -> None:
    assert our_namespaces() == []
    assert not cluster_support.STATE_DIR.exists()
    assert cluster_processes(inodes) == []
    assert cluster_support.node_cpuset("node1") is None  # the nodes' cpusets are gone
    assert root_addresses_in(subnet) == []
    # Every veth and bridge lived only inside the namespaces: the host never saw one.
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert not re.search(r"^\d+: (sw0|up0|n\d+)[@:]", links.stdout, re.MULTILINE)


def test_up_replaces_a_cluster_whose_daemons_are_gone(slurm_cluster: LocalCluster) -> None:
    """A restart kills the daemons but leaves the state directory (and here the
    namespaces): `up` must rebuild instead of refusing a cluster that is not idle."""
    namespaces = [cluster_support.SWITCH_NAMESPACE] + [n.namespace for n in slurm_cluster.nodes]
    for namespace in namespaces:
        pids = subprocess.run(
            ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=True
        ).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
    inodes = {namespace_inode(ns) for ns in namespaces}
    wait_until("the killed daemons are gone", lambda: not cluster_processes(inodes))
    assert cluster_support.STATE_DIR.joinpath("nodes").exists()

    proc = cluster_support.script("up", "--nodes", str(len(slurm_cluster.nodes)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stale test cluster" in proc.stdout
    idle = slurm_cluster.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"]).stdout.split()
    assert sorted(set(idle)) == sorted(n.name for n in slurm_cluster.nodes)


def test_down_and_a_failed_up_leave_nothing(slurm_cluster: LocalCluster) -> None:
    namespaces = [cluster_support.SWITCH_NAMESPACE] + [n.namespace for n in slurm_cluster.nodes]
    inodes = {namespace_inode(ns) for ns in namespaces}
    assert cluster_processes(inodes), "the cluster should have live daemons before down"
    assert root_addresses_in(slurm_cluster.subnet) == []
    try:
        cluster_support.down()
        assert_nothing_left(inodes, slurm_cluster.subnet)

        # An `up` that fails after it has made namespaces (an address ip refuses) undoes
        # itself: the same checks hold.
        failed = subprocess.run(
            ["bash", str(cluster_support.SCRIPT), "up"],
            capture_output=True,
            text=True,
            env={**os.environ, "HPCVM_TEST_CLUSTER_NET": "10.77.300"},
            timeout=cluster_support.UP_TIMEOUT,
            check=False,
        )
        assert failed.returncode != 0
        assert "up failed" in failed.stderr
        assert_nothing_left(inodes, slurm_cluster.subnet)
    finally:
        # Later tests in the session get their cluster back.
        cluster_support.up(len(slurm_cluster.nodes))
