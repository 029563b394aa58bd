"""Where a cluster job's tests submit it: the Slurm test cluster or this machine under
hpcvm's ``local`` batch system, behind one small interface, so that the same test cases
run under both (``site`` fixture, parametrised).

- ``SlurmSite``: the one-machine Slurm cluster of network namespaces
  (scripts/test-cluster.sh, tests/cluster_support.py) configured as a site is: jobs
  submitted by the unprivileged test user (``sbatch -N 2`` as ``hpcvm-test``, with the
  node install's grants and an hpcvm that user can run), Slurm's cgroup plugins,
  ``scancel``, Slurm's own job state.
- ``LocalSite``: a network namespace made here with a bridge ``br0`` (the only place
  its VMs' traffic goes), the example script run in it as a plain process with
  ``HPCVM_BATCH=local``: the script's shell is the job's leader, so killing it is this
  site's ``scancel``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest

from tests import cluster_support
from tests.cluster_support import LocalCluster

REPO = Path(__file__).resolve().parent.parent
JOB_TIMEOUT = 420.0  # two TCG guests on a loaded 2-core machine; a bound on a hang
NETGUARD_CONF = "/etc/hpcvm/netguard.conf"  # scripts/install-node.sh's netguard step
BRIDGE_ACL = "/etc/qemu/hpcvm-bridges.conf"  # the node install's (scripts/install-node.sh)


@dataclass
class Job:
    """A submitted job: its id, its output file, and (local) its process."""

    id: str
    out: Path
    proc: subprocess.Popen[bytes] | None = None
    returncode: int | None = None


class Site(Protocol):
    batch: str
    uid: int  # who the jobs run as
    node_prefix: str  # node names are this and 1, 2...
    subnet_prefix: str  # the nodes' /24, e.g. "10.77.0"

    def expected_addresses(self) -> list[set[str]]:
        """For each node of a 2-node job, the addresses ``--address auto`` may give."""
        ...

    def job_env(self, name: str, **extra: str) -> dict[str, str]: ...

    def submit(self, script: Path, workdir: Path, env: Mapping[str, str], *args: str) -> Job: ...

    def wait(self, job: Job) -> int: ...

    def cancel(self, job: Job) -> None: ...

    def interrupt(self, job: Job) -> None: ...

    def ended_badly(self, job: Job) -> bool: ...

    def extra_links(self) -> dict[str, list[str]]: ...

    @contextlib.contextmanager
    def bridge_on_first_node_only(self, bridge: str) -> Iterator[str]: ...

    def diagnostics(self) -> str: ...

    def outside_job_cgroup(self, pid: int, job: Job) -> str:
        """What of ``pid``'s cgroups lies outside the job's ("": nothing)."""
        ...

    def runtime_root(self) -> Path:
        """Where the jobs' hpcvm keeps its VMs (that user's default)."""
        ...

    def job_dir(self) -> contextlib.AbstractContextManager[Path]:
        """A directory a job of this site may run in and write to."""
        ...


def default_runtime_root(uid: int) -> Path:
    """hpcvm's runtime root for a user without XDG_RUNTIME_DIR (runtime/hostside/paths.py)."""
    return Path("/run/hpcvm") if uid == 0 else Path(f"/tmp/hpcvm-{uid}")


@contextlib.contextmanager
def root_job_dir() -> Iterator[Path]:
    """A job directory QEMU's unprivileged user can read (pytest's tmp_path is 0700
    root's, which ``cluster up`` refuses: the guests see the job's directory)."""
    path = Path(tempfile.mkdtemp(prefix="hpcvm-cluster-test-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


POOL_SLOTS = 4


def pool_of(subnet_prefix: str) -> str:
    """The site's VM address pool the tests configure: the upper half of the nodes' /24."""
    return f"{subnet_prefix}.128/25"


def site_config(subnet_prefix: str) -> Path:
    """A site configuration (cluster/tasks/addresses.py) for ``--address auto`` on a site's
    /24, written once per prefix where every node reads it."""
    path = Path(f"/run/hpcvm-test-site-{subnet_prefix.replace('.', '-')}.toml")
    text = f'[addresses]\npool = "{pool_of(subnet_prefix)}"\nslots = {POOL_SLOTS}\n'
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        path.chmod(0o644)
    return path


def auto_address(subnet_prefix: str, node_host: int, slot: int) -> str:
    """What ``--address auto`` must give slot ``slot`` of the node at host ``node_host``
    of the /24, computed here from the pool's definition (docs/cluster.md)."""
    pool = ipaddress.IPv4Network(pool_of(subnet_prefix))
    ip = pool.network_address + 1 + node_host * POOL_SLOTS + slot
    return f"{ip}/24"


def base_env(hpcvm: str, name: str, subnet_prefix: str) -> dict[str, str]:
    """The example scripts' settings for a test job: 1 vCPU and 256 MiB per VM (the CI
    budget), addresses from the site's pool (the scripts' default ``--address auto``),
    TCG (no VT-x here), and no housekeeping core (each node may have a single PU)."""
    return {
        "HPCVM": hpcvm,
        "HPCVM_NAME": name,
        "HPCVM_MEMORY": "256M",
        "HPCVM_SITE_CONFIG": str(site_config(subnet_prefix)),
        "HPCVM_UP_OPTIONS": "--accel tcg --housekeeping 0",
    }


def links_in(namespace: str, known: set[str]) -> list[str]:
    text = subprocess.run(
        ["ip", "-n", namespace, "-o", "link"], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in text.splitlines()}
    return sorted(names - known)


def _batch_signals() -> None:
    """A job starts with every signal at its default action, as slurmd starts one,
    whatever this test process inherited: run in the background by a non-interactive
    shell (`nohup .ci/run &`), it ignores SIGINT and SIGHUP, and a job started from it
    would too (bash cannot trap a signal ignored on entry, Python installs no
    KeyboardInterrupt handler), so interrupting it would test nothing."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)


@dataclass
class SlurmSite:
    """The Slurm test cluster, its jobs submitted by the unprivileged test user."""

    cluster: LocalCluster
    hpcvm: str
    user: str | None = cluster_support.TEST_USER
    batch: str = "slurm"
    node_prefix: str = "node"
    subnet_prefix: str = cluster_support.NET_PREFIX

    def job_env(self, name: str, **extra: str) -> dict[str, str]:
        return {**base_env(self.hpcvm, name, self.subnet_prefix), **extra}

    def expected_addresses(self) -> list[set[str]]:
        """Node K is host K of the /24: slot 0 of its own slots (no other job runs)."""
        return [{auto_address(self.subnet_prefix, k, 0)} for k in (1, 2)]

    def submit(self, script: Path, workdir: Path, env: Mapping[str, str], *args: str) -> Job:
        out = workdir / "job.out"
        argv = ["sbatch", "-N", "2", f"--chdir={workdir}", f"--output={out}", "--parsable"]
        proc = self.cluster.run(
            [*argv, str(script), *args], env=dict(env), user=self.user, check=False
        )
        assert proc.returncode == 0, proc.stderr
        return Job(id=proc.stdout.strip().split(";")[0], out=out)

    @property
    def uid(self) -> int:
        return pwd.getpwnam(self.user).pw_uid if self.user else 0

    def runtime_root(self) -> Path:
        return default_runtime_root(self.uid)

    @contextlib.contextmanager
    def job_dir(self) -> Iterator[Path]:
        if self.user is None:
            with root_job_dir() as path:
                yield path
            return
        with cluster_support.user_dir() as path:
            yield path

    def wait(self, job: Job) -> int:
        wait_until("Slurm to end the job", lambda: not self._queued(job))
        state = self.cluster.run(["scontrol", "show", "job", job.id], check=False).stdout
        job.returncode = 0 if "JobState=COMPLETED" in state else 1
        return job.returncode

    def _queued(self, job: Job) -> bool:
        return bool(self.cluster.run(["squeue", "-h", "-j", job.id], check=False).stdout.strip())

    def cancel(self, job: Job) -> None:
        self.cluster.run(["scancel", job.id], user=self.user, check=False)

    def interrupt(self, job: Job) -> None:
        self.cluster.run(["scancel", "--batch", "--full", "--signal=INT", job.id], user=self.user)

    def ended_badly(self, job: Job) -> bool:
        # Slurm keeps an ended job's record for MinJobAge (30 s here): it says how it ended.
        state = self.cluster.run(["scontrol", "show", "job", job.id], check=False).stdout
        return any(f"JobState={s}" in state for s in ("FAILED", "CANCELLED"))

    def extra_links(self) -> dict[str, list[str]]:
        out = {}
        for node in self.cluster.nodes:
            extra = links_in(node.namespace, {"lo", "up0", "br0"})
            if extra:
                out[node.name] = extra
        return out

    @contextlib.contextmanager
    def bridge_on_first_node_only(self, bridge: str) -> Iterator[str]:
        """The bridge on node 1, and allowed to the site's users for the while (the
        admin's ACL of QEMU's bridge helper, and 'bridge' and 'range' lines in
        hpcvm-netguard's config, whose guard would refuse a tap in it otherwise): only
        node 2 lacks it."""
        ns1 = self.cluster.nodes[0].namespace
        acl, guard = Path(BRIDGE_ACL), Path(NETGUARD_CONF)
        before = acl.read_text() if acl.exists() else None
        guarded = guard.read_text() if guard.exists() else None
        subprocess.run(["ip", "-n", ns1, "link", "add", bridge, "type", "bridge"], check=True)
        try:
            if before is not None:
                acl.write_text(f"{before}allow {bridge}\n")
            if guarded is not None:  # brt has no subnet: the guard's range is the segment's
                guard.write_text(f"{guarded}bridge {bridge}\nrange {self.cluster.subnet}\n")
            yield f"{self.node_prefix}2"
        finally:
            if before is not None:
                acl.write_text(before)
            if guarded is not None:
                guard.write_text(guarded)
            subprocess.run(["ip", "-n", ns1, "link", "del", bridge], check=False)

    def diagnostics(self) -> str:
        return self.cluster.log_tails()

    def outside_job_cgroup(self, pid: int, job: Job) -> str:
        """Under Slurm's cgroup plugins every process of a job is in the job's cgroup
        of each controller (``.../job_ID/...``), as /proc/PID/cgroup says."""
        if cluster_support.confinement() != "cgroup":
            return ""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return ""  # gone meanwhile
        wanted = ("freezer", "memory", "cpuset")
        bad = [
            line
            for line in lines
            if set(line.split(":")[1].split(",")) & set(wanted)
            and f"/job_{job.id}/" not in line.split(":", 2)[2] + "/"
        ]
        return "; ".join(bad)


LOCAL_NAMESPACE = "hpcvm-lb"
LOCAL_PREFIX = os.environ.get("HPCVM_TEST_LOCAL_NET", "10.79.0")


@dataclass
class LocalSite:
    """This machine under ``--batch local`` in a namespace of its own."""

    hpcvm: str
    namespace: str = LOCAL_NAMESPACE
    batch: str = "local"
    node_prefix: str = "local"
    subnet_prefix: str = LOCAL_PREFIX
    jobs: list[Job] = field(default_factory=list)
    uid: int = 0

    def runtime_root(self) -> Path:
        return default_runtime_root(self.uid)

    @contextlib.contextmanager
    def job_dir(self) -> Iterator[Path]:
        with root_job_dir() as path:
            yield path

    def job_env(self, name: str, **extra: str) -> dict[str, str]:
        return {
            **base_env(self.hpcvm, name, self.subnet_prefix),
            "HPCVM_BATCH": "local",
            "HPCVM_NODES": "2",
            **extra,
        }

    def expected_addresses(self) -> list[set[str]]:
        """Every local node is this host (the bridge's .1): the two VMs take two slots
        of its, in whichever order they claim them."""
        both = {auto_address(self.subnet_prefix, 1, s) for s in (0, 1)}
        return [both, both]

    def submit(self, script: Path, workdir: Path, env: Mapping[str, str], *args: str) -> Job:
        out = workdir / "job.out"
        with out.open("wb") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, "bash", str(script), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                cwd=workdir,
                start_new_session=True,
                preexec_fn=_batch_signals,
            )
        job = Job(id=str(proc.pid), out=out, proc=proc)
        self.jobs.append(job)
        return job

    def wait(self, job: Job) -> int:
        assert job.proc is not None
        job.returncode = job.proc.wait(timeout=JOB_TIMEOUT)
        return job.returncode

    def _signal(self, job: Job, signum: int) -> None:
        assert job.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.proc.pid, signum)

    def cancel(self, job: Job) -> None:
        self._signal(job, signal.SIGKILL)  # the leader and every process of the job

    def interrupt(self, job: Job) -> None:
        self._signal(job, signal.SIGINT)

    def ended_badly(self, job: Job) -> bool:
        assert job.proc is not None
        return job.proc.wait(timeout=JOB_TIMEOUT) != 0

    def extra_links(self) -> dict[str, list[str]]:
        extra = links_in(self.namespace, {"lo", "br0"})
        return {self.namespace: extra} if extra else {}

    @contextlib.contextmanager
    def bridge_on_first_node_only(self, bridge: str) -> Iterator[str]:
        # One host: a bridge no node has (each node's failure names that node).
        yield rf"{self.node_prefix}\d"

    def diagnostics(self) -> str:
        return ""

    def outside_job_cgroup(self, pid: int, job: Job) -> str:
        return ""  # no batch system's cgroups on one workstation

    def close(self) -> None:
        for job in self.jobs:
            if job.proc is not None and job.proc.poll() is None:
                self._signal(job, signal.SIGKILL)
                job.proc.wait(timeout=60)


@contextlib.contextmanager
def local_namespace() -> Iterator[str]:
    """A network namespace with a bridge ``br0`` at .1 of the local site's /24, removed
    afterwards with everything in it."""
    if os.geteuid() != 0:
        pytest.skip("the local site needs root (a network namespace and a bridge)")
    ns = LOCAL_NAMESPACE
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "link", "add", "br0", "type", "bridge"],
        ["ip", "-n", ns, "addr", "add", f"{LOCAL_PREFIX}.1/24", "dev", "br0"],
        ["ip", "-n", ns, "link", "set", "br0", "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = JOB_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)
