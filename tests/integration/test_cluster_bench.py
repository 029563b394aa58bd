"""`hpcvm bench --nodes 2` inside a Slurm job on the one-machine test cluster: the same
MPI command natively across the two nodes and across a vm:hpc VM on each, into a
results database and a report.

The command is NetPIPE's ping-pong over a few small sizes (`--suite cmd --cmd-mpi`):
the bench path (mpirun spread over the nodes, one VM cluster per profile, samples,
logs) is the same for every MPI suite, and the full `netpipe` and `hpcc` suites take
many minutes per sample across two TCG guests on 2 cores (docs/examples/
hpcvm-bench-job.sh runs them; the README shows such a run).

Oracles independent of hpcvm's summary: each stored sample's log (Open MPI's
``--report-bindings`` lines name the host of each rank: both nodes natively, both VMs
in vm:hpc), SQLite read directly, the report's files.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from tests import cluster_support
from tests.cluster_support import LocalCluster
from tests.integration.test_cluster_job import (
    HPCVM,
    assert_nothing_left,
    hugepages_free,
    job_dir,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster

REPO = Path(__file__).resolve().parents[2]
BENCH_SCRIPT = REPO / "docs" / "examples" / "hpcvm-bench-job.sh"
BENCH_TIMEOUT = 1500.0  # two TCG guests running MPI over a bridge on 2 shared cores
BINDING = re.compile(r"\[(\S+?):\d+\] MCW rank (\d+) (?:is not bound|bound)")


NETPIPE = "NPopenmpi -u 1024 -n 20 -p 0"
LATENCY_1K = r"1024 bytes +[0-9]+ times --> +[0-9.]+ Mbps in +([0-9.]+) usec"
JOB = """#!/bin/sh
set -e
{hpcvm} bench --nodes 2 --env native --env vm:hpc --cmd '{cmd}' --cmd-mpi \\
    --metric '{metric}' --lower-is-better --unit us --metric-name latency_1KiB \\
    --np 2 --reps 2 --address 10.77.0.101/24 --vm-memory 512M --out {out}
{hpcvm} report {out}
"""


def test_bench_across_two_nodes_records_native_and_vm_runs_spanning_both(
    slurm_cluster: LocalCluster,
    job_dir: Path,  # noqa: F811
) -> None:
    free = hugepages_free()
    out = job_dir / "results"
    job = job_dir / "bench.sh"
    job.write_text(JOB.format(hpcvm=HPCVM, cmd=NETPIPE, metric=LATENCY_1K, out=out))
    log = job_dir / "job.out"
    proc = slurm_cluster.run(
        ["sbatch", "-N", "2", "--wait", f"--chdir={job_dir}", f"--output={log}", str(job)],
        timeout=BENCH_TIMEOUT,
        check=False,
    )
    text = log.read_text(errors="replace") if log.exists() else ""
    assert proc.returncode == 0, f"{proc.stderr}\n{text}\n{slurm_cluster.log_tails()}"

    db = sqlite3.connect(out / "hpcvm.db")
    envs = dict(db.execute("SELECT id, name FROM environments").fetchall())
    assert sorted(envs.values()) == ["native", "vm:hpc"]
    rows = db.execute("SELECT env_id, ok, log_path FROM samples WHERE warmup = 0").fetchall()
    assert sorted((envs[e], ok) for e, ok, _ in rows) == [
        ("native", 1),
        ("native", 1),
        ("vm:hpc", 1),
        ("vm:hpc", 1),
    ], rows
    for env_id, _, log_path in rows:
        hosts = {h for h, _ in BINDING.findall(Path(log_path).read_text(errors="replace"))}
        if envs[env_id] == "native":
            assert hosts == {"node1", "node2"}, log_path
        else:
            assert sorted(h.rsplit("-", 1)[1] for h in hosts) == ["node1", "node2"], hosts
    versions = dict(db.execute("SELECT name, versions_json FROM environments").fetchall())
    assert json.loads(versions["vm:hpc"])["nodes"] == "2"
    assert (out / "report" / "report.html").is_file()
    assert_nothing_left(slurm_cluster, "bench", free)
