"""The one-machine Slurm test cluster works with real parts (scripts/test-cluster.sh).

Real slurmctld, slurmd (one per simulated node, each in its own network namespace) and
munged, real Open MPI, and Slurm's own cgroup confinement (proctrack/cgroup, task/cgroup
with ConstrainCores, ConstrainRAMSpace and ConstrainDevices) of jobs submitted by an
unprivileged test user. The oracles are the kernel's own view, read from the host side
or from inside the job: the inode of each namespace's /run/netns entry, the address
``ip -n`` shows on the node's bridge, the processes in /proc (their credentials, session
and cgroups), the cgroup files (tasks, cpuset.cpus, memory.limit_in_bytes), open()'s
errno, and the OOM killer; never what the script says about itself.
The last test takes the cluster down, checks that nothing of it remains, checks that an
``up`` failing halfway leaves nothing either, and brings the cluster back up.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import cluster_support
from tests.cluster_support import TEST_UID, TEST_USER, LocalCluster

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster
user_hpcvm = cluster_support.user_hpcvm

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


def submit(
    cluster: LocalCluster,
    workdir: Path,
    body: str,
    *,
    nodes: int | None = None,
    user: str | None = None,
) -> str:
    """Submit a batch script with ``sbatch -N <nodes, default all>`` (as ``user``,
    default root), wait until Slurm has no more record of it running, and return its
    output file's text; fail with the output and logs unless Slurm says it completed.
    (Polled here every half second: ``sbatch --wait`` polls every 10 s after a while.)"""
    batch = workdir / "job.sh"
    batch.write_text("#!/bin/sh\nset -e\n" + body)
    out = workdir / "job.out"
    count = str(nodes or len(cluster.nodes))
    argv = ["sbatch", "--parsable", "-N", count, f"--chdir={workdir}", f"--output={out}"]
    job = cluster.run([*argv, str(batch)], env=cluster.mpi_env(), user=user).stdout
    job_id = job.strip().split(";")[0]
    wait_until(
        f"job {job_id} to end",
        lambda: not cluster.run(["squeue", "-h", "-j", job_id], check=False).stdout.strip(),
    )
    state = cluster.run(["scontrol", "show", "job", job_id], check=False).stdout
    text = out.read_text() if out.exists() else "(no output file)"
    if "JobState=COMPLETED" not in state:
        pytest.fail(f"batch job failed:\n{state}\njob output:\n{text}\n{cluster.log_tails()}")
    return text


def test_sinfo_shows_every_node_idle_at_its_namespace_address(slurm_cluster: LocalCluster) -> None:
    slurm_cluster.wait_settled()  # an earlier module's job may still run its epilog
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


def srun_as_user(
    cluster: LocalCluster, workdir: Path, script: str, *options: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) as one task on each of the nodes ``options`` ask for (default
    all), submitted with ``srun`` by the test user; with ``check`` a failure fails the
    test with its output."""
    path = workdir / "task.sh"
    path.write_text(script)
    nodes = ["-N", str(len(cluster.nodes))] if not any(o.startswith("-N") for o in options) else []
    argv = ["srun", *nodes, *options, "--ntasks-per-node=1", f"--chdir={workdir}", "sh", str(path)]
    return cluster.run(argv, user=TEST_USER, timeout=JOB_TIMEOUT, check=check)


def by_host(text: str) -> dict[str, list[str]]:
    """Lines ``HOST FIELD...`` as {host: fields}."""
    return {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.strip()}


@pytest.fixture
def user_dir() -> Iterator[Path]:
    with cluster_support.user_dir() as path:
        yield path


def test_a_job_of_the_test_user_runs_as_that_user_in_the_sites_groups(
    slurm_cluster: LocalCluster, user_dir: Path
) -> None:
    """The kernel's credentials of the task on every node: the user's uid and gid,
    and the site's group and kvm among its groups (what hpcvm's grants go by)."""
    report = (
        'echo $(hostname) $(grep -E "^(Uid|Gid|Groups):" /proc/self/status | tr -s "\t\n" "  ")'
    )
    seen = by_host(srun_as_user(slurm_cluster, user_dir, report).stdout)
    assert sorted(seen) == sorted(node.name for node in slurm_cluster.nodes), seen
    user = pwd.getpwnam(TEST_USER)
    for host, fields in seen.items():
        uid = fields[fields.index("Uid:") + 1 : fields.index("Gid:")]
        gid = fields[fields.index("Gid:") + 1 : fields.index("Groups:")]
        groups = {int(g) for g in fields[fields.index("Groups:") + 1 :]}
        assert uid == [str(TEST_UID)] * 4 and gid == [str(user.pw_gid)] * 4, (host, fields)
        assert {cluster_support.SITE_GID, grp.getgrnam("kvm").gr_gid} <= groups, (host, fields)


def test_the_test_user_runs_hpcvm_in_a_job_that_sees_its_nodes_pus(
    slurm_cluster: LocalCluster, user_hpcvm: Path, user_dir: Path
) -> None:
    """The user's hpcvm (a venv of Debian's Python every user can read) runs in a job
    on every node and reads that node: its hostname, and as allowed PUs exactly the
    node's cpuset (hwloc inside Slurm's cgroup)."""
    script = f"{user_hpcvm} host --json >{user_dir}/host-$(hostname).json\n"
    srun_as_user(slurm_cluster, user_dir, script)
    for node in slurm_cluster.nodes:
        host = json.loads((user_dir / f"host-{node.name}.json").read_text())
        assert host["hostname"] == node.name
        allowed = {pu["os_index"] for pu in host["pus"] if pu["allowed"]}
        cpuset = cluster_support.node_cpuset(node.name)
        if cpuset is not None:
            assert allowed == cpuset[0], (node.name, allowed, cpuset)


CGROUP_OF_TASK = (
    'c=$(sed -n "s/^[0-9]*:cpuset://p" /proc/self/cgroup);'
    ' m=$(sed -n "s/^[0-9]*:memory://p" /proc/self/cgroup);'
)


def test_constrain_cores_gives_each_job_its_nodes_own_pus(
    slurm_cluster: LocalCluster, user_dir: Path
) -> None:
    """task/cgroup's cpuset is the node's share of the PUs (its CpuSpecList reserves the
    rest): the task's allowed CPUs, its cgroup's cpuset.cpus and the node's cpuset agree,
    and two nodes' differ (where the machine has two PUs to give)."""
    cluster_support.needs_slurm_cgroups()
    if cluster_support.node_cpuset("node1") is None:
        pytest.skip("no cpuset cgroups on this machine: the nodes share every PU")
    report = (
        CGROUP_OF_TASK + 'echo $(hostname) $(sed -n "s/^Cpus_allowed_list:\t//p" /proc/self/status)'
        " $(cat /sys/fs/cgroup/cpuset$c/cpuset.cpus) $c"
    )
    seen = by_host(srun_as_user(slurm_cluster, user_dir, report).stdout)
    assert sorted(seen) == sorted(node.name for node in slurm_cluster.nodes), seen
    for node, (allowed, cgroup_cpus, cgroup) in seen.items():
        cpuset = cluster_support.node_cpuset(node)
        assert cpuset is not None
        assert cluster_support.expand_list(allowed) == cpuset[0], (node, seen)
        assert cluster_support.expand_list(cgroup_cpus) == cpuset[0], (node, seen)
        assert cgroup.startswith(f"{cluster_support.slurm_cgroup_root(node)}/uid_{TEST_UID}/job_")
    if len(os.sched_getaffinity(0)) >= 2:
        assert seen["node1"][0] != seen["node2"][0], seen


def test_constrain_ram_space_limits_a_job_to_its_mem_and_kills_beyond(
    slurm_cluster: LocalCluster, user_dir: Path
) -> None:
    """--mem=200M is the job's memory.limit_in_bytes (job and step), and the kernel's
    OOM killer ends a task that touches 400 MiB, while 100 MiB run to the end."""
    cluster_support.needs_slurm_cgroups()
    report = (
        CGROUP_OF_TASK + "job=${m%/step_*}; step=${m%/task_*};"
        " echo $(hostname) $(cat /sys/fs/cgroup/memory$job/memory.limit_in_bytes)"
        " $(cat /sys/fs/cgroup/memory$step/memory.limit_in_bytes)\n"
        "python3 -c \"b = bytes(1) * ($MIB << 20); print('touched', $MIB, 'MiB')\"\n"
    )
    limit = str(200 << 20)
    small = srun_as_user(slurm_cluster, user_dir, "MIB=100\n" + report, "-N1", "--mem=200M")
    host, *rest = small.stdout.split()  # any idle node: Slurm picks it
    assert host in {node.name for node in slurm_cluster.nodes}, small
    assert rest == [limit, limit, "touched", "100", "MiB"], small
    big = srun_as_user(
        slurm_cluster, user_dir, "MIB=400\n" + report, "-N1", "--mem=200M", check=False
    )
    assert big.returncode != 0, big.stdout
    assert "touched" not in big.stdout and "Out Of Memory" in big.stderr, big.stdout + big.stderr


OPEN_DEVICES = (
    "import os, sys\n"
    "for path in sys.argv[1:]:\n"
    "    try:\n"
    "        os.close(os.open(path, os.O_RDONLY))\n"
    "        print(path, 'ok')\n"
    "    except OSError as e:\n"
    "        print(path, e.errno)\n"
)


def test_constrain_devices_denies_a_device_the_job_was_not_given(
    slurm_cluster: LocalCluster, user_dir: Path
) -> None:
    """The GRES device (/dev/full standing in for a VFIO group: every user may open it,
    mode 0666) is refused by the job's devices cgroup (EPERM, not DAC's EACCES) unless
    the job asked for it (--gres=nic:1); /dev/kvm, which no GRES names, stays open."""
    cluster_support.needs_slurm_cgroups()
    device = cluster_support.GRES_DEVICE
    (user_dir / "open.py").write_text(OPEN_DEVICES)
    paths = [device] + (["/dev/kvm"] if Path("/dev/kvm").exists() else [])
    script = f"python3 {user_dir / 'open.py'} {' '.join(paths)}\n"

    def opened(*options: str) -> dict[str, str]:
        out = srun_as_user(slurm_cluster, user_dir, script, "-N1", *options).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    without, given = opened(), opened("--gres=nic:1")
    assert without[device] == str(errno.EPERM), without
    assert given[device] == "ok", given
    if "/dev/kvm" in paths:
        assert without["/dev/kvm"] == given["/dev/kvm"] == "ok", (without, given)


def test_run_on_a_node_runs_in_that_nodes_namespace(slurm_cluster: LocalCluster) -> None:
    for node in slurm_cluster.nodes:
        out = slurm_cluster.run(
            ["sh", "-c", "hostname; stat -L -c %i /proc/self/ns/net"], node=node.name
        )
        assert out.stdout.split() == [node.name, str(namespace_inode(node.namespace))]


@pytest.fixture(scope="module")
def mpi_ping() -> Iterator[Path]:
    """tests/cluster/mpi_ping.c built with Open MPI's mpicc, where the test user can run
    it (the nodes share the file system, as cluster nodes share a home directory)."""
    if shutil.which("mpicc") is None:
        pytest.skip(f"mpicc (libopenmpi-dev) is missing; {cluster_support.INSTALL_HINT}")
    with cluster_support.user_dir("hpcvm-mpi-") as path:
        exe = path / "mpi_ping"
        subprocess.run(["mpicc", "-O1", "-o", str(exe), str(MPI_PING)], check=True)
        yield exe


def assert_one_rank_per_node(cluster: LocalCluster, text: str) -> None:
    """Two ranks, each on its own node, in that node's namespace, and the token made the
    round trip (42 sent, 43 back): the ranks talked over the cluster's TCP network. Which
    two nodes is Slurm's choice (a node still running the last job's epilog is skipped)."""
    ranks = [m.groups() for m in map(RANK_LINE.match, text.splitlines()) if m]
    assert len(ranks) == 2, text
    by_host = {host: (int(size), int(inode), int(token)) for _, size, host, inode, token in ranks}
    assert len(by_host) == 2, text
    namespaces = {node.name: node.namespace for node in cluster.nodes}
    assert by_host == {
        host: (2, namespace_inode(namespaces[host]), 43) for host in by_host if host in namespaces
    }, text


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
    text = submit(slurm_cluster, tmp_path, LAUNCHERS[launcher].format(exe=mpi_ping), nodes=2)
    assert_one_rank_per_node(slurm_cluster, text)


def test_mpi_across_two_nodes_as_the_test_user(
    slurm_cluster: LocalCluster, mpi_ping: Path, user_dir: Path
) -> None:
    """The same run submitted by the unprivileged user (sbatch, then srun's PMIx)."""
    body = LAUNCHERS["srun-pmix"].format(exe=mpi_ping)
    text = submit(slurm_cluster, user_dir, body, nodes=2, user=TEST_USER)
    assert_one_rank_per_node(slurm_cluster, text)
    assert (user_dir / "job.out").stat().st_uid == TEST_UID  # written as the user


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


def user_processes(inodes: dict[int, str]) -> dict[int, str]:
    """The test user's live processes in the nodes' namespaces (``inodes``: namespace
    inode to node name), as {pid: node}."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != TEST_UID:
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            inode = os.stat(proc / "ns" / "net").st_ino
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state != "Z" and inode in inodes:
            found[int(proc.name)] = inodes[inode]
    return found


def cgroups_of(pid: int) -> dict[str, str]:
    """{controller: cgroup path} of a process, from /proc/PID/cgroup (cgroup v1)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return {
        c: path for _, cs, path in (line.split(":", 2) for line in lines) for c in cs.split(",")
    }


def session_of(pid: int) -> int:
    # After the command name: state, ppid, pgrp, session.
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def test_a_users_job_lives_in_its_cgroups_and_scancel_ends_all_of_it(
    slurm_cluster: LocalCluster, user_dir: Path
) -> None:
    """Every process of a job the test user submitted, on every node, is in that job's
    cgroups (freezer, cpuset, memory, devices under /slurm_<node>/uid_<uid>/job_<id>/,
    listed in the cgroup's own tasks file), also a process that left the job's session
    with setsid (which process-group tracking would lose); the user's scancel ends them
    all (proctrack/cgroup)."""
    cluster_support.needs_slurm_cgroups()
    mark = str(3000 + os.getpid() % 1000)  # marks this test's sleeps
    batch = user_dir / "long.sh"
    task = f"setsid sleep {mark} & exec sleep {mark}"
    batch.write_text(f"#!/bin/sh\nsrun --ntasks-per-node=1 sh -c '{task}'\n")
    nodes = len(slurm_cluster.nodes)
    job = slurm_cluster.run(
        ["sbatch", "--parsable", "-N", str(nodes), f"--chdir={user_dir}", str(batch)],
        user=TEST_USER,
    ).stdout.strip()
    job_id = job.split(";")[0]
    inodes = {namespace_inode(node.namespace): node.name for node in slurm_cluster.nodes}

    def sleeps() -> dict[int, str]:
        return {
            pid: node
            for pid, node in user_processes(inodes).items()
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]
            == [b"sleep", mark.encode()]
        }

    try:
        wait_until("two sleeps on every node", lambda: len(sleeps()) == 2 * nodes)
        found = sleeps()
        assert sorted(found.values()) == sorted(2 * list(inodes.values())), found
        escaped = [pid for pid in found if session_of(pid) == pid]  # setsid: its own session
        assert len(escaped) == nodes, found
        processes = user_processes(inodes)
        for pid, node in processes.items():
            groups = cgroups_of(pid)
            prefix = f"{cluster_support.slurm_cgroup_root(node)}/uid_{TEST_UID}/job_{job_id}/"
            for controller in ("freezer", "cpuset", "memory", "devices"):
                path = groups[controller]
                assert path.startswith(prefix), (pid, node, controller, path)
                tasks = Path(f"/sys/fs/cgroup/{controller}{path}/tasks").read_text().split()
                assert str(pid) in tasks, (pid, controller, path)
    finally:
        slurm_cluster.run(["scancel", job_id], user=TEST_USER)
    wait_until("scancel to end every process of the job", lambda: not user_processes(inodes))


def test_two_jobs_of_two_nodes_run_at_once_on_four_nodes(
    slurm_cluster: LocalCluster, user_dir: Path
) -> None:
    """Four nodes hold two 2-node jobs at the same time, on disjoint nodes."""
    if len(slurm_cluster.nodes) < 4:
        pytest.skip("needs four nodes (HPCVM_TEST_CLUSTER_NODES)")
    jobs = []
    try:
        for _ in range(2):
            argv = ["sbatch", "--parsable", "-N", "2", f"--chdir={user_dir}", "--wrap", "sleep 600"]
            jobs.append(slurm_cluster.run(argv, user=TEST_USER).stdout.strip().split(";")[0])

        def running() -> dict[str, str]:
            out = slurm_cluster.run(["squeue", "-h", "-t", "R", "-o", "%i %N"]).stdout
            return {i: n for i, n in (line.split() for line in out.splitlines()) if i in jobs}

        wait_until("both jobs to run", lambda: len(running()) == 2)
        assert sorted(running().values()) == ["node[1-2]", "node[3-4]"], running()
    finally:
        slurm_cluster.run(["scancel", *jobs], user=TEST_USER, check=False)


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
    assert sorted(Path("/sys/fs/cgroup").glob("*/slurm_node*")) == []  # and Slurm's cgroups
    with pytest.raises(KeyError):
        pwd.getpwnam(TEST_USER)  # and the test user
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
