"""`hpcvm bench --nodes 2` inside a Slurm job on the one-machine test cluster: the example
batch script (docs/examples/hpcvm-bench-job.sh), submitted by the unprivileged test user
with `sbatch -N 2` to the site-configured cluster (Slurm's cgroup plugins, the node
install's grants), runs NetPIPE with `mpirun -np 2` natively across the two nodes, in a
container on each (rootless: the test user's) and across a vm:hpc VM on each, into a
results database and a report the user owns.

Sizes are the smallest (`--size quick`, two repetitions, NetPIPE only: the script's
default adds HPC Challenge, whose path across nodes is the same and which takes minutes
in two TCG guests): the path (one VM per node planned on its node, mpirun spread over
the nodes, samples, logs, figures) is what is tested, not the numbers.

Oracles independent of hpcvm's summary: each stored sample's log (Open MPI's
``--report-bindings`` lines name the host of each rank: both nodes natively, both VMs
in vm:hpc; NetPIPE's own lines name the host each rank reads from inside: its node's
container), the kernel's cpuset files of the test cluster's nodes (which PUs each node
has: the VM pins and native PUs recorded for each node must be those), SQLite read
directly, the report's files.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from tests import cluster_support, sites
from tests.cluster_support import LocalCluster
from tests.integration.test_cluster_job import assert_nothing_left, hugepages_free

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster
user_hpcvm = cluster_support.user_hpcvm

REPO = Path(__file__).resolve().parents[2]
BENCH_SCRIPT = REPO / "docs" / "examples" / "hpcvm-bench-job.sh"
BENCH_TIMEOUT = 1500.0  # two TCG guests running MPI over a bridge on 2 shared cores
BINDING = re.compile(r"\[(\S+?):\d+\] MCW rank (\d+) (?:is not bound|bound)")
RANK_HOST = re.compile(r"^([01]): (\S+)$", re.M)  # NetPIPE: each rank's own gethostname()
ENVS = ("native", "container", "vm:hpc")
SUITES = ("netpipe",)
REPS = 2


def test_the_example_bench_job_runs_netpipe_across_two_nodes(
    slurm_cluster: LocalCluster, user_hpcvm: Path
) -> None:
    site = sites.SlurmSite(slurm_cluster, str(user_hpcvm))
    with site.job_dir() as job_dir:
        _bench_job(slurm_cluster, site, job_dir)


def _bench_job(slurm_cluster: LocalCluster, site: sites.SlurmSite, job_dir: Path) -> None:
    free = hugepages_free()
    out = job_dir / "results"
    log = job_dir / "job.out"
    settings = {
        "HPCVM": str(site.hpcvm),
        "HPCVM_OUT": str(out),
        "HPCVM_NP": "2",
        "HPCVM_SUITES": " ".join(SUITES),
        "HPCVM_ENVS": " ".join(ENVS),
        "HPCVM_REPS": str(REPS),
        "HPCVM_SITE_CONFIG": str(sites.site_config(cluster_support.NET_PREFIX)),
        "HPCVM_BENCH_OPTIONS": "--size quick --vm-memory 512M",
    }
    proc = slurm_cluster.run(
        ["sbatch", "-N", "2", "--wait", f"--chdir={job_dir}", f"--output={log}", str(BENCH_SCRIPT)],
        env=settings,
        user=site.user,
        timeout=BENCH_TIMEOUT,
        check=False,
    )
    text = log.read_text(errors="replace") if log.exists() else ""
    assert proc.returncode == 0, f"{proc.stderr}\n{text}\n{slurm_cluster.log_tails()}"

    owners = {p.stat().st_uid for p in out.rglob("*")} | {out.stat().st_uid}
    assert owners == {site.uid}, owners  # the results are the user's
    db = sqlite3.connect(out / "hpcvm.db")
    envs = dict(db.execute("SELECT id, name FROM environments").fetchall())
    assert sorted(envs.values()) == sorted(ENVS)
    rows = db.execute("SELECT env_id, suite, ok, log_path FROM samples WHERE warmup = 0").fetchall()
    counts = sorted((envs[e], suite, ok) for e, suite, ok, _ in rows)
    expected = sorted((env, suite, 1) for env in envs.values() for suite in SUITES) * REPS
    assert counts == sorted(expected), rows
    for env_id, suite, _, log_path in rows:
        text = Path(log_path).read_text(errors="replace")
        hosts = {h for h, _ in BINDING.findall(text)}
        if envs[env_id] == "native":
            assert hosts == {"node1", "node2"}, (suite, log_path)
        elif envs[env_id] == "container":
            # mpirun's daemons on both nodes; each rank in its node's container (its
            # UTS namespace's hostname, as the rank itself reads it)
            assert hosts == {"node1", "node2"}, (suite, log_path)
            inside = dict(RANK_HOST.findall(text))
            assert sorted(inside) == ["0", "1"], text
            assert set(inside.values()) == {f"hpcvm-container-{h}" for h in hosts}, text
        else:
            assert sorted(h.rsplit("-", 1)[1] for h in hosts) == ["node1", "node2"], hosts
    versions = {
        name: json.loads(v)
        for name, v in db.execute("SELECT name, versions_json FROM environments").fetchall()
    }
    assert versions["vm:hpc"]["nodes"] == versions["native"]["nodes"] == "2"
    pins = dict(p.split(": 0->") for p in versions["vm:hpc"]["vcpu_pins"].split("; "))
    native = dict(p.split(": ", 1) for p in versions["native"]["native_pus"].split("; "))
    assert sorted(pins) == sorted(native) == ["node1", "node2"], versions
    for node in ("node1", "node2"):
        cpuset = cluster_support.node_cpuset(node)
        if cpuset is not None:
            # Each node planned its own VM and its own native PUs, on the PUs it has.
            assert int(pins[node]) in cpuset[0], (node, pins, cpuset)
            assert native[node] == f"PUs {pins[node]}, mems {min(cpuset[1])}", (node, native)
    _check_container_record(versions["container"])
    figures = out / "report" / "figures"
    assert (out / "report" / "report.html").is_file()
    assert (figures / "sizes-netpipe.png").is_file(), sorted(figures.iterdir())
    assert_nothing_left(site, "bench", free)


def _check_container_record(record: dict[str, str]) -> None:
    """The container environment's record names its runtime and, per node, the PUs its
    processes were allowed: the kernel's cpuset of that test-cluster node."""
    assert record["nodes"] == "2"
    assert record["container_runtime"].split()[0] in ("crun", "runc"), record
    assert "psec=none" in record["container_ranks"], record
    for part in record["container_cpus"].split("; "):
        node = part.split(":", 1)[0]
        cpuset = cluster_support.node_cpuset(node)
        pus = re.search(r"PUs ([\d,-]+)", part)
        assert pus is not None, part
        if cpuset is not None:
            assert cluster_support.expand_list(pus.group(1)) <= cpuset[0], (part, cpuset)
