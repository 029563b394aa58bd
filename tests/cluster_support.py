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
or the tests do not run as root. A cluster that was already up when the session began
(a developer's, started by hand) is reused and left up. How it is built and why:
docs/cluster-testing.md.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "test-cluster.sh"
CLUSTER_NODES = 2
STATE_DIR = Path(os.environ.get("HPCVM_TEST_CLUSTER_DIR", "/run/hpcvm-test-cluster"))
NET_PREFIX = os.environ.get("HPCVM_TEST_CLUSTER_NET", "10.77.0")
SWITCH_NAMESPACE = "hpcvm-sw"
NODE_NAMESPACE_PREFIX = "hpcvm-n"
# The programs the script runs; a missing one skips the cluster tests with this hint.
REQUIRED_TOOLS = ("ip", "nsenter", "unshare", "flock", "munged", "slurmctld", "slurmd", "sinfo")
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
        timeout: float = COMMAND_TIMEOUT,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the login (switch) namespace, or on ``node`` (its namespace
        and hostname), with ``SLURM_CONF`` set; output captured as text. With ``check``
        a non-zero exit fails the test with the command's output."""
        where = ["--node", node] if node else []
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

    def log_tails(self, lines: int = 15) -> str:
        """The ends of the daemons' logs, for a failure message."""
        out = []
        for log in sorted((self.state_dir / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}:\n" + "\n".join(text))
        return "\n".join(out)


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
        return "the Slurm test cluster needs root (network namespaces, bridges)"
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


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalCluster]:
    """A running test cluster for the session; torn down at its end unless it was
    already up when the session began."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    was_up = is_up()
    cluster = up(CLUSTER_NODES)
    try:
        yield cluster
    finally:
        if not was_up:
            down()
