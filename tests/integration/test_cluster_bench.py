"""`hpcvm bench --nodes 2` inside a Slurm job: the example bench script, submitted with
``sbatch -N 2`` to the one-machine test cluster, runs NetPIPE natively across the two
nodes and across a vm:hpc VM on each, into a results database and a report with the
latency/bandwidth figure. (hpcc across the VMs runs in test_cluster_job.py: one hpcc
sample across two TCG guests takes minutes on 2 cores, too long for every CI run; the
bench path is the same for every MPI suite.)

Oracles independent of hpcvm's own summary: each stored sample's log (Open MPI's
``--report-bindings`` lines name the host each rank ran on: both nodes natively, both
VMs in vm:hpc), NetPIPE's own output file per sample, SQLite read directly, and the
report's PNG files opened by Pillow.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
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


def test_bench_across_two_nodes_records_native_and_vm_runs_spanning_both(
    slurm_cluster: LocalCluster,
    job_dir: Path,  # noqa: F811
) -> None:
    free = hugepages_free()
    out = job_dir / "results"
    env = {
        "HPCVM": HPCVM,
        "HPCVM_OUT": str(out),
        "HPCVM_NP": "2",
        "HPCVM_REPS": "1",
        "HPCVM_SUITES": "netpipe",
        "HPCVM_ADDRESS": "10.77.0.101/24",
        "HPCVM_BENCH_OPTIONS": "--size quick --vm-memory 512M --timeout 15m",
    }
    log = job_dir / "job.out"
    proc = slurm_cluster.run(
        ["sbatch", "-N", "2", "--wait", f"--chdir={job_dir}", f"--output={log}", str(BENCH_SCRIPT)],
        env=env,
        timeout=BENCH_TIMEOUT,
        check=False,
    )
    text = log.read_text(errors="replace") if log.exists() else ""
    assert proc.returncode == 0, f"{proc.stderr}\n{text}\n{slurm_cluster.log_tails()}"

    db = sqlite3.connect(out / "hpcvm.db")
    envs = dict(db.execute("SELECT id, name FROM environments").fetchall())
    assert sorted(envs.values()) == ["native", "vm:hpc"]
    rows = db.execute("SELECT env_id, suite, ok, log_path FROM samples WHERE warmup = 0").fetchall()
    seen = {(envs[e], suite) for e, suite, ok, _ in rows if ok}
    assert seen == {("native", "netpipe"), ("vm:hpc", "netpipe")}, rows
    for env_id, suite, ok, log_path in rows:
        if not ok:
            continue
        hosts = {h for h, _ in BINDING.findall(Path(log_path).read_text(errors="replace"))}
        expected = {"node1", "node2"} if envs[env_id] == "native" else set()
        if envs[env_id] == "native":
            assert hosts == expected, (suite, log_path)
        else:
            assert len(hosts) == 2 and all(h.endswith(("-node1", "-node2")) for h in hosts), hosts

    results = subprocess.run(
        [HPCVM, "results", str(out), "--json"], capture_output=True, text=True, check=True
    )
    data = json.loads(results.stdout)
    assert any(r["suite"] == "netpipe" and r["env"] == "vm:hpc" for r in data["rows"])
    figures = sorted(p.name for p in (out / "report" / "figures").glob("*.png"))
    assert "sizes-netpipe.png" in figures, figures
    assert_nothing_left(slurm_cluster, "bench", free)
