"""The one-machine Slurm test cluster (scripts/test-cluster.sh) for tests.

``slurm_cluster`` (session fixture) brings up a cluster of ``CLUSTER_NODES`` simulated
nodes, each a network namespace with its own address, bridge, hostname and slurmd,
behind one slurmctld and munged, and yields a ``LocalCluster``: the nodes' names,
namespaces and addresses, the subnet, the environment that reaches that slurmctld
(``SLURM_CONF``), and ``run()`` to run a command inside the cluster (Slurm is only
reachable from inside its namespaces; the host's own network is never changed). At the
end of the session it runs ``down``. A test module uses it by re-exporting the fixture::

    from tests import cluster_support
    slurm_cluster = cluster_support.slurm_cluster

It skips, saying what to install, when Slurm, munge or the namespace tools are missing
or the tests do not run as root. A cluster started by hand (a developer's) is reused and
left up; one a test session started goes down when the last session using it ends,
also when the session that started it was killed before its teardown. How it is built and why:
docs/cluster-testing.md.

Jobs are confined by Slurm's cgroup plugins and may be submitted as an unprivileged
test user, as on a real site: ``run(..., user=TEST_USER)`` runs a command as that user
(``runuser``), ``user_dir()`` makes a working directory the user owns, and the session
fixture ``user_hpcvm`` gives an ``hpcvm`` command the user can run (a venv built with
Debian's Python by ``scripts/install-node.sh --only venv``; the default Python here lives
under /root, which other users cannot read).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "test-cluster.sh"
INSTALL_NODE = REPO / "scripts" / "install-node.sh"
# Four nodes: two 2-node jobs can run at once (a job of -N 2 alone gets node1 and node2).
CLUSTER_NODES = int(os.environ.get("HPCVM_TEST_CLUSTER_NODES", "4"))
# The unprivileged user jobs are submitted as (made by the script's `up`, in the site's
# group and in kvm; ids as in scripts/test-cluster.sh and scripts/site-ids.sh).
TEST_USER = os.environ.get("HPCVM_TEST_USER", "hpcvm-test")
TEST_UID = int(os.environ.get("HPCVM_TEST_UID", "2390"))
SITE_GROUP = os.environ.get("HPCVM_GROUP", "hpcvm")
SITE_GID = int(os.environ.get("HPCVM_GID", "2300"))
# hpcvm for the test user: one venv per checkout (in <this>/venv, with the install's
# state and a build lock beside it), rebuilt when its inputs change.
USER_VENV_HOME = Path(
    os.environ.get(
        "HPCVM_TEST_USER_VENV",
        f"/var/tmp/hpcvm-test-venv-{hashlib.sha256(str(REPO).encode()).hexdigest()[:8]}",
    )
)
VENV_TIMEOUT = 900.0  # a first build downloads numpy, scipy, matplotlib
# The device of the cluster's one GRES (nic:1 per node, a stand-in for a VFIO group):
# Slurm's ConstrainDevices denies it to every job that did not ask --gres=nic:1.
GRES_DEVICE = "/dev/full"
STATE_DIR = Path(os.environ.get("HPCVM_TEST_CLUSTER_DIR", "/run/hpcvm-test-cluster"))
NET_PREFIX = os.environ.get("HPCVM_TEST_CLUSTER_NET", "10.77.0")
SWITCH_NAMESPACE = "hpcvm-sw"
NODE_NAMESPACE_PREFIX = "hpcvm-n"
# The programs the script runs; a missing one skips the cluster tests with this hint.
REQUIRED_TOOLS = (
    "ip",
    "nsenter",
    "unshare",
    "flock",
    "munged",
    "slurmctld",
    "slurmd",
    "sinfo",
    "hwloc-calc",
    "useradd",
    "runuser",
)
INSTALL_HINT = "install with scripts/setup-cluster.sh"
UP_TIMEOUT = 180.0  # seconds; the script itself gives up after 90 s per daemon
COMMAND_TIMEOUT = 120.0


@dataclass(frozen=True)
class ClusterNode:
    """One simulated node: Slurm's node name (also its hostname), its network
    namespace and its address on the cluster's subnet (on the node's bridge ``br0``)."""

    name: str
    namespace: str
    address: str
    bridge: str = "br0"


@dataclass(frozen=True)
class LocalCluster:
    """A running test cluster, as the script built it."""

    nodes: tuple[ClusterNode, ...]
    state_dir: Path
    subnet: str  # e.g. "10.77.0.0/24"
    controller_address: str
    env: Mapping[str, str] = field(default_factory=dict)  # what reaches this slurmctld

    def run(
        self,
        argv: Sequence[str],
        *,
        node: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float = COMMAND_TIMEOUT,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the login (switch) namespace, or on ``node`` (its namespace
        and hostname), with ``SLURM_CONF`` set, as root or as ``user`` (e.g.
        ``TEST_USER``: ``sbatch`` then submits the job as that user); output captured as
        text. With ``check`` a non-zero exit fails the test with the command's output."""
        where = ["--node", node] if node else []
        if user:
            where += ["--user", user]
        full_env = {**os.environ, **self.env, **(env or {})}
        proc = subprocess.run(
            ["bash", str(SCRIPT), "exec", *where, "--", *argv],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            pytest.fail(
                f"{' '.join(argv)} exited {proc.returncode} in the test cluster\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\n{self.log_tails()}"
            )
        return proc

    def mpi_env(self) -> dict[str, str]:
        """Open MPI settings for runs across the nodes: TCP only (so messages really
        cross the namespaces' network rather than shared memory), both the out-of-band
        layer and the transport told to use the cluster's subnet, and root allowed."""
        return {
            "OMPI_MCA_btl": "tcp,self",
            "OMPI_MCA_btl_tcp_if_include": self.subnet,
            "OMPI_MCA_oob_tcp_if_include": self.subnet,
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo prints it (idle, completing, allocated ...)."""
        proc = self.run(["sinfo", "-h", "-N", "-o", "%N %T"])
        return dict(line.split()[:2] for line in proc.stdout.splitlines() if line.strip())

    def wait_settled(self, timeout: float = 120.0) -> dict[str, str]:
        """The node states once no node is still completing an earlier test's job
        (its epilog runs after the job's end), so a test that reads the cluster's
        resting state does not race the tests before it. Fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        states = self.node_states()
        while any(s.startswith("completing") for s in states.values()):
            if time.monotonic() > deadline:
                pytest.fail(f"nodes still completing after {timeout:.0f} s: {states}")
            time.sleep(1.0)
            states = self.node_states()
        return states

    def log_tails(self, lines: int = 15) -> str:
        """The ends of the daemons' logs, for a failure message."""
        out = []
        for log in sorted((self.state_dir / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}:\n" + "\n".join(text))
        return "\n".join(out)


def confinement() -> str:
    """How the running cluster confines jobs: "cgroup" (Slurm's cgroup plugins, cgroup
    v1) or "none" (a host without cgroup v1 controllers: process groups and the nodes'
    cpusets only), as the script recorded it."""
    path = STATE_DIR / "confinement"
    return path.read_text().strip() if path.exists() else "none"  # (an older script's)


def needs_slurm_cgroups() -> None:
    """Skip, saying why, where the cluster runs without Slurm's cgroup plugins."""
    if confinement() != "cgroup":
        pytest.skip("no cgroup v1 controllers here: the test cluster runs without Slurm's cgroups")


def slurm_cgroup_root(node: str) -> str:
    """The cgroup (v1, every controller) under which ``node``'s slurmd puts its jobs:
    ``/slurm_<node>``, then ``/uid_<uid>/job_<id>/step_<step>`` (Slurm 22.05 with
    multiple-slurmd support names each slurmd's subtree by its node)."""
    return f"/slurm_{node}"


@contextlib.contextmanager
def user_dir(prefix: str = "hpcvm-user-") -> Iterator[Path]:
    """A directory the test user owns (0755, under /var/tmp: pytest's tmp_path is
    root's 0700), for a job's script, output and files; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    try:
        os.chown(path, TEST_UID, TEST_UID)
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_user(argv: Sequence[str], user: str = TEST_USER) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` on this host (not in the cluster) as ``user`` (the test user)."""
    return subprocess.run(
        ["runuser", "-u", user, "--", *argv],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )


def build_user_hpcvm(home: Path = USER_VENV_HOME, user: str = TEST_USER) -> Path:
    """``hpcvm`` in a venv every user can run, built from this checkout with Debian's
    Python by the node install's venv step: editable where the test user can read the
    checkout, else a copy of it in the venv (a checkout under /root, say)."""
    probe = as_user(["test", "-r", str(REPO / "src" / "hpcvm" / "__init__.py")], user)
    editable = probe.returncode == 0  # else a copy in the venv: the user reads that
    home = home.with_name(home.name + ("" if editable else "-copy"))
    home.mkdir(exist_ok=True)
    home.chmod(0o755)  # whatever the umask: the user must reach the venv
    venv = home / "venv"
    env = {
        **os.environ,
        "HPCVM_PREFIX": str(venv),
        "HPCVM_BIN_LINK": "",
        "HPCVM_NODE_STATE": str(home / "state"),
    }
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (two sessions)
        proc = subprocess.run(
            ["bash", str(INSTALL_NODE), "--only", "venv", *(["--editable"] if editable else [])],
            capture_output=True,
            text=True,
            env=env,
            timeout=VENV_TIMEOUT,
            check=False,
        )
    if proc.returncode != 0:
        pytest.fail(f"building {venv} failed:\n{proc.stdout}{proc.stderr}")
    hpcvm = venv / "bin" / "hpcvm"
    check = as_user([str(hpcvm), "--version"], user)
    if check.returncode != 0:
        pytest.fail(f"{user} cannot run {hpcvm}:\n{check.stdout}{check.stderr}")
    return hpcvm


def node_cpuset(node: str) -> tuple[frozenset[int], frozenset[int]] | None:
    """The PUs and memory nodes the test cluster gave ``node``, as the kernel's cpuset
    files list them; None where the script made no cpusets (docs/cluster-testing.md)."""
    for base in (Path("/sys/fs/cgroup/cpuset"), Path("/sys/fs/cgroup")):
        where = base / "hpcvm-test-cluster" / node
        if (where / "cpuset.cpus").is_file():
            read = (where / f for f in ("cpuset.cpus", "cpuset.mems"))
            cpus, mems = (expand_list(path.read_text()) for path in read)
            return cpus, mems
    return None


def expand_list(text: str) -> frozenset[int]:
    """A kernel list such as ``0-2,5``."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            out.update(range(int(low), int(high or low) + 1))
    return frozenset(out)


def missing_requirements() -> str | None:
    """Why the test cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces, bridges, its test user)"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the Slurm test cluster needs {', '.join(missing)}; {INSTALL_HINT}"
    return None


def script(*args: str, timeout: float = UP_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run scripts/test-cluster.sh with ``args``; output captured as text."""
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def is_up() -> bool:
    """Whether a test cluster is up (the script's own answer)."""
    return script("status", timeout=COMMAND_TIMEOUT).returncode == 0


def up(nodes: int = CLUSTER_NODES) -> LocalCluster:
    """Start (or find running) a cluster of ``nodes``; fail the test with the script's
    output if it cannot."""
    proc = script("up", "--nodes", str(nodes))
    if proc.returncode != 0:
        pytest.fail(f"scripts/test-cluster.sh up failed:\n{proc.stdout}{proc.stderr}")
    return describe(nodes)


def down() -> None:
    """Stop the cluster and remove all of it; fail the test if the script reports
    anything left."""
    proc = script("down")
    if proc.returncode != 0:
        pytest.fail(f"scripts/test-cluster.sh down failed:\n{proc.stdout}{proc.stderr}")


def describe(nodes: int) -> LocalCluster:
    """The cluster the script builds for ``nodes`` nodes (its fixed naming scheme)."""
    members = tuple(
        ClusterNode(f"node{k}", f"{NODE_NAMESPACE_PREFIX}{k}", f"{NET_PREFIX}.{k}")
        for k in range(1, nodes + 1)
    )
    subnet = str(ipaddress.ip_network(f"{NET_PREFIX}.0/24"))
    return LocalCluster(
        nodes=members,
        state_dir=STATE_DIR,
        subnet=subnet,
        controller_address=f"{NET_PREFIX}.254",
        env={"SLURM_CONF": str(STATE_DIR / "etc" / "slurm.conf")},
    )


# Test sessions that use the cluster, one file each (``<pid>-<start time>``), beside the
# cluster's state directory (which ``down`` removes) so that registering needs no cluster.
SESSIONS_DIR = Path(os.environ.get("HPCVM_TEST_CLUSTER_SESSIONS", f"{STATE_DIR}-sessions"))
# In the registry (not in the cluster's state directory, which a test taking the cluster
# down and up again, as test_cluster_infra does, would remove): a pytest session brought
# this cluster up, so the last session to leave takes it down (a cluster started by hand
# has no such mark: left up).
STARTED_MARK = "started-by-pytest"


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (/proc/PID/stat field 22), or
    None when it is gone: with the pid it names one process, never a later one that got
    the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def live_sessions(sessions: Path = SESSIONS_DIR) -> list[Path]:
    """The registered sessions whose process still runs; files of dead ones (a session
    killed before its teardown) are removed on the way."""
    alive = []
    for entry in sorted(sessions.glob("*-*")):
        named = re.fullmatch(r"(\d+)-(\d+)", entry.name)
        if named is None:
            continue  # not a session's entry (the started mark)
        if process_start(int(named[1])) == named[2]:
            alive.append(entry)
        else:
            entry.unlink(missing_ok=True)
    return alive


@contextlib.contextmanager
def sessions_locked(sessions: Path = SESSIONS_DIR) -> Iterator[None]:
    """Hold the registry's lock: registering and bringing the cluster up, or leaving and
    taking it down, happen as one step, so one session never tears the cluster down
    between another's check and its use."""
    sessions.mkdir(mode=0o700, exist_ok=True)
    with open(sessions / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def register_session(sessions: Path = SESSIONS_DIR) -> Path:
    """Record this process as a user of the cluster (the lock is held by the caller)."""
    entry = sessions / f"{os.getpid()}-{process_start(os.getpid())}"
    entry.touch()
    return entry


def leave_session(entry: Path) -> bool:
    """Unregister ``entry``; whether the cluster should now go down: a pytest session
    started it (the mark, which this then removes) and no live session still uses it. A
    session killed before its teardown (its cluster would otherwise stay up for ever,
    every later session finding it up and leaving it so) is thus cleaned up after by the
    next one to leave."""
    entry.unlink(missing_ok=True)
    mark = entry.parent / STARTED_MARK
    if not mark.exists() or live_sessions(entry.parent):
        return False
    mark.unlink()
    return True


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalCluster]:
    """A running test cluster for the session. The last session to leave a cluster that
    a session started takes it down; one started by hand is left up."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with sessions_locked():
        was_up = is_up()
        cluster = up(CLUSTER_NODES)
        if not was_up:
            (SESSIONS_DIR / STARTED_MARK).touch()
        entry = register_session()
    try:
        yield cluster
    finally:
        with sessions_locked():
            if leave_session(entry):
                down()
        forget_sessions()


def forget_sessions(sessions: Path = SESSIONS_DIR) -> None:
    """Remove the registry when no session is left in it: nothing stays behind."""
    if not live_sessions(sessions) and not (sessions / STARTED_MARK).exists():
        with contextlib.suppress(OSError):
            (sessions / ".lock").unlink()
            sessions.rmdir()


@pytest.fixture(scope="session")
def user_hpcvm(slurm_cluster: LocalCluster) -> Path:
    """The path of an ``hpcvm`` the test user can run (after the cluster made the
    user); a test module re-exports it as it does ``slurm_cluster``. The cluster's
    epilog (docs/examples/slurm-epilog.sh) runs it too, as a site's runs its own."""
    assert pwd.getpwnam(TEST_USER).pw_uid == TEST_UID
    hpcvm = build_user_hpcvm()
    (STATE_DIR / "etc" / "epilog-hpcvm").write_text(f"{hpcvm}\n")
    return hpcvm


def vm_count(prefix: str) -> int:
    """QEMU processes on this machine whose command line names a VM ``prefix...``
    (/proc, not hpcvm's own records)."""
    found = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"qemu-system" in cmdline and prefix.encode() in cmdline:
                found += 1
    return found


def job_state(cluster: LocalCluster, job: str) -> str:
    """Slurm's state of ``job`` (GONE once it left the controller)."""
    text = cluster.run(["scontrol", "show", "job", job], check=False).stdout
    found = re.search(r"JobState=(\S+)", text)
    return found.group(1) if found else "GONE"


def built_test_image() -> Path:
    """The test image (tests/image_builder.py), readable by the test user's QEMU;
    skipped when it cannot be built here."""
    from tests import image_builder

    missing = image_builder.missing_tools()
    if missing:
        pytest.skip(f"cannot build the test image: missing {', '.join(missing)}")
    path = image_builder.build_test_image()
    for part in (path, *path.parents):
        if part == Path("/var/cache"):
            break
        part.chmod(part.stat().st_mode | 0o005)
    return path


@pytest.fixture(scope="module")
def image() -> Path:
    """The test image, for a module's cluster job (``image = cluster_support.image``)."""
    return built_test_image()


@contextlib.contextmanager
def small_fs(cluster: LocalCluster, size_mib: int) -> Iterator[Path]:
    """A tmpfs of ``size_mib`` MiB, the test user's (0700), that every node of the
    test cluster sees at the same path, as a site's shared file system: mounted under
    the script's shared mount point (``$DIR/mnt``, whose copies in the nodes' mount
    namespaces are its slaves). ``free_only`` fills it; unmounted afterwards."""
    shared = cluster.state_dir / "mnt"
    # mountpoint(1) reads the mount table: a bind mount on its own file system has the
    # st_dev of its parent, which os.path.ismount takes for no mount
    if subprocess.run(["mountpoint", "-q", str(shared)], check=False).returncode != 0:
        pytest.fail(
            f"{shared} is no mount point: this test cluster was started by an older "
            "scripts/test-cluster.sh; run `scripts/test-cluster.sh down` and test again"
        )
    path = Path(tempfile.mkdtemp(prefix="fs-", dir=shared))
    options = f"size={size_mib}m,mode=0700,uid={TEST_UID},gid={TEST_UID}"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "hpcvm-test-fs", str(path)],
                   check=True)  # fmt: skip
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        with contextlib.suppress(OSError):
            path.rmdir()


def fs_used(path: Path) -> int:
    """Bytes used on the file system at ``path`` (statvfs)."""
    info = os.statvfs(path)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


@contextlib.contextmanager
def free_only(path: Path, free_bytes: int) -> Iterator[None]:
    """The tmpfs at ``path`` (``small_fs``) shrunk to what it holds plus
    ``free_bytes`` while inside, as a disk that fills: the next large write gets ENOSPC
    from the kernel. Its size is given back afterwards."""
    before = os.statvfs(path)
    size = before.f_blocks * before.f_frsize
    for _attempt in range(5):  # a size below what it holds is refused: it grew meanwhile
        tight = fs_used(path) + free_bytes
        argv = ["mount", "-o", f"remount,size={tight // 1024}k", str(path)]
        if subprocess.run(argv, check=False, capture_output=True).returncode == 0:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"could not shrink the tmpfs at {path} to what it holds")
    try:
        yield
    finally:
        subprocess.run(["mount", "-o", f"remount,size={size // 1024}k", str(path)], check=True)


@contextlib.contextmanager
def link_down(node: str) -> Iterator[None]:
    """Node ``node``'s link to the cluster's switch down while inside (its uplink veth
    ``up0``, in its own namespace), as a cable pulled or a switch port that fails: the
    node and its VMs reach nothing, and nothing reaches them."""
    namespace = f"{NODE_NAMESPACE_PREFIX}{node.removeprefix('node')}"
    subprocess.run(["ip", "-n", namespace, "link", "set", "up0", "down"], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "-n", namespace, "link", "set", "up0", "up"], check=True)


def pids_with(cmdline: Sequence[bytes], environ: Sequence[bytes] = ()) -> list[int]:
    """Pids of the processes on this machine whose command line holds every one of
    ``cmdline`` and whose environment every one of ``environ`` (/proc, not hpcvm's own
    records; a process that ends while read is passed over)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes() if environ else b""
        except OSError:
            continue
        if all(part in cmd for part in cmdline) and all(part in env for part in environ):
            found.append(int(proc.name))
    return found
