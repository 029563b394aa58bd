"""`hpcvm bench --nodes 2` inside a Slurm job on the one-machine test cluster: the example
batch script (docs/examples/hpcvm-bench-job.sh), submitted by the unprivileged test user
with `sbatch -N 2` to the site-configured cluster (Slurm's cgroup plugins, the node
install's grants), runs NetPIPE and the bsp suite with `mpirun -np 2` natively across the
two nodes, in a container on each (rootless: the test user's) and across a vm:hpc VM on
each, into a results database and a report the user owns.

Sizes are the smallest (`--size quick`, two repetitions, NetPIPE and 200 bsp steps: the
script's default adds HPC Challenge, whose path across nodes is the same and which takes
minutes in two TCG guests): the path (one VM per node planned on its node, mpirun spread
over the nodes, samples, logs, figures) is what is tested, not the numbers.

Oracles independent of hpcvm's summary: each stored sample's log (Open MPI's
``--report-bindings`` lines name the host of each rank: both nodes natively, both VMs
in vm:hpc; NetPIPE's own lines name the host each rank reads from inside: its node's
container), the kernel's cpuset files of the test cluster's nodes (which PUs each node
has: the VM pins and native PUs recorded for each node must be those), SQLite read
directly, the report's files.

The same job's bsp samples are then the check of ``report --scale`` across nodes
(docs/scale.md, "On the test cluster"): with the noise traces of a one-node noise run of
native and vm:hpc on a cluster node (``--scale-noise``), the report sets each bsp
measurement at 2 ranks beside its prediction. Checked without depending on this loaded
host's noise: a row per environment with measured and predicted values and intervals,
predictions that never fall as ranks grow, the measured slowdown and its Student-t
interval recomputed here from the bsp program's raw step files, and the printed verdict
and the Markdown table agreeing with those numbers.
"""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tests import cluster_support, sites
from tests.cluster_support import LocalCluster
from tests.integration.test_cluster_job import assert_nothing_left, hugepages_free

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster
user_hpcvm = cluster_support.user_hpcvm

REPO = Path(__file__).resolve().parents[2]
HPCVM = str(Path(sys.executable).with_name("hpcvm"))  # the report: root reads the user's
BENCH_SCRIPT = REPO / "docs" / "examples" / "hpcvm-bench-job.sh"
BENCH_TIMEOUT = 1500.0  # two TCG guests running MPI over a bridge on 2 shared cores
BINDING = re.compile(r"\[(\S+?):\d+\] MCW rank (\d+) (?:is not bound|bound)")
VM_CLUSTER = re.compile(r"^hpcvm: (bench\d+-hpc): starting a VM on 2 node", re.M)
RANK_HOST = re.compile(r"^([01]): (\S+)$", re.M)  # NetPIPE: each rank's own gethostname()
ENVS = ("native", "container", "vm:hpc")
SUITES = ("netpipe", "bsp")
REPS = 2
BSP_STEPS = 200


@dataclass(frozen=True)
class BenchJob:
    """The example job's run: the site it ran on and where it wrote."""

    site: sites.SlurmSite
    job_dir: Path
    out: Path
    hugepages_before: int


@pytest.fixture(scope="module")
def bench_job(slurm_cluster: LocalCluster, user_hpcvm: Path) -> Iterator[BenchJob]:
    """The example bench job, run once for this module's tests (its directory removed
    after them)."""
    site = sites.SlurmSite(slurm_cluster, str(user_hpcvm))
    with site.job_dir() as job_dir:
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
            "HPCVM_BENCH_OPTIONS": f"--size quick --vm-memory 512M --bsp-steps {BSP_STEPS}",
        }
        argv = ["sbatch", "-N", "2", "--wait", f"--chdir={job_dir}", f"--output={log}"]
        proc = slurm_cluster.run(
            [*argv, str(BENCH_SCRIPT)],
            env=settings,
            user=site.user,
            timeout=BENCH_TIMEOUT,
            check=False,
        )
        text = log.read_text(errors="replace") if log.exists() else ""
        assert proc.returncode == 0, f"{proc.stderr}\n{text}\n{slurm_cluster.log_tails()}"
        yield BenchJob(site=site, job_dir=job_dir, out=out, hugepages_before=free)


def test_the_example_bench_job_runs_across_two_nodes(bench_job: BenchJob) -> None:
    site, out = bench_job.site, bench_job.out
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
            if suite != "netpipe":
                continue
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
    # the bench's cluster of VMs by its name (bench<pid>-hpc), not any VM named bench-...:
    # another worker's bench-naive guest may run meanwhile
    text = (bench_job.job_dir / "job.out").read_text(errors="replace")
    clusters = set(VM_CLUSTER.findall(text))
    assert len(clusters) == 1, text
    assert_nothing_left(site, clusters.pop(), bench_job.hugepages_before)


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


NOISE_TIMEOUT = 600.0  # one TCG guest's boot and two short noise samples per environment
NOISE_QUANTA = 4000
SCALE_ENVS = ("native", "vm:hpc")  # the environments the noise run measured
CONFIDENCE = 0.97  # the bench's default


def _noise_run(slurm_cluster: LocalCluster, job: BenchJob) -> Path:
    """A one-node noise run of native and vm:hpc on a node of the cluster, as the test
    user (bench --nodes refuses the noise suite: it measures one node's CPUs)."""
    out = job.job_dir / "noise"
    bench = [job.site.hpcvm, "bench", *(f"--env={e}" for e in SCALE_ENVS), "--suite=noise"]
    bench += [f"--reps={REPS}", f"--noise-quanta={NOISE_QUANTA}", "--vm-memory=512M"]
    log = job.job_dir / "noise.out"
    argv = ["sbatch", "-N", "1", "--wait", f"--chdir={job.job_dir}", f"--output={log}"]
    proc = slurm_cluster.run(
        [*argv, "--wrap", shlex.join([*bench, f"--out={out}"])],
        user=job.site.user,
        timeout=NOISE_TIMEOUT,
        check=False,
    )
    text = log.read_text(errors="replace") if log.exists() else ""
    assert proc.returncode == 0, f"{proc.stderr}\n{text}"
    return out


def _raw_slowdowns(out: Path) -> dict[str, list[float]]:
    """Each environment's bsp slowdown per measured sample, from the program's own raw
    step files (SQLite read directly for where they are): the mean step over the quiet
    step (the fastest grain plus the fastest step-minus-grain), minus one, in %."""
    db = sqlite3.connect(out / "hpcvm.db")
    query = (
        "SELECT e.name, s.workdir FROM samples s JOIN environments e ON e.id = s.env_id "
        "WHERE s.suite = 'bsp' AND s.warmup = 0 AND s.ok = 1"
    )
    found: dict[str, list[float]] = {}
    for env, workdir in db.execute(query).fetchall():
        times: dict[str, list[list[int]]] = {"grain": [], "step": []}
        for line in (Path(workdir) / "bsp-raw.txt").read_text().splitlines():
            kind, _, *values = line.split()
            times[kind].append([int(v) for v in values])
        grains, steps = np.array(times["grain"]), np.array(times["step"])
        assert grains.shape == steps.shape == (2, BSP_STEPS)
        quiet = grains.min() + max(int((steps - grains).min()), 0)
        found.setdefault(env, []).append(100.0 * (steps.mean() / quiet - 1.0))
    return found


def test_scale_prediction_beside_bsp_across_two_nodes(
    slurm_cluster: LocalCluster, bench_job: BenchJob, tmp_path: Path
) -> None:
    noise = _noise_run(slurm_cluster, bench_job)
    rep = tmp_path / "rep"
    argv = [HPCVM, "report", str(bench_job.out), "--scale", "1024", "--grain", "100us"]
    argv += ["--scale-noise", str(noise), "--format", "json", "--format", "md"]
    done = subprocess.run(
        [*argv, "--out", str(rep)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    scale = json.loads((rep / "report.json").read_text())["report"]["scale"]
    measured = {(m["env"], m["cores"]): m for m in scale["measured"]}
    assert set(measured) == {(env, 2) for env in ENVS}, sorted(measured)
    raw = _raw_slowdowns(bench_job.out)
    t = stats.t.ppf(1.0 - (1.0 - CONFIDENCE) / 2.0, REPS - 1)
    verdicts = dict(re.findall(r"^bsp check: (\S+) np 2, .*: (agree|DISAGREE)$", done.stdout, re.M))
    table = (rep / "report.md").read_text().split("### Prediction checked", 1)[1]
    for env in SCALE_ENVS:
        m = measured[(env, 2)]
        values = np.array(raw[env])
        assert len(values) == REPS
        half = t * values.std(ddof=1) / np.sqrt(REPS)
        assert m["slowdown_pct"] == pytest.approx(values.mean(), rel=1e-9)
        assert m["low_pct"] == pytest.approx(values.mean() - half, rel=1e-9, abs=1e-9)
        assert m["high_pct"] == pytest.approx(values.mean() + half, rel=1e-9, abs=1e-9)
        low, point, high = m["predicted_low_pct"], m["predicted_pct"], m["predicted_high_pct"]
        assert 0.0 <= low <= point <= high, m  # noise only ever delays
        agree = m["low_pct"] <= high and low <= m["high_pct"]  # the intervals meet
        assert verdicts[env] == ("agree" if agree else "DISAGREE"), done.stdout
        row = f"| {env} | 2 | {m['grain_ns'] / 1e3:.3g} | "
        assert f"{row}{m['slowdown_pct']:+.2f} [" in table
        assert f"| {'yes' if agree else 'no'} |" in table.split(row, 1)[1].splitlines()[0]
    # the container ran bsp but no noise: measured, with no prediction beside it
    assert measured[("container", 2)]["predicted_pct"] is None
    assert any("container: bsp np 2 has no prediction" in note for note in scale["notes"])
    curves = [c for c in scale["curves"] if c["env"] in SCALE_ENVS]
    assert {c["env"] for c in curves} == set(SCALE_ENVS)
    for c in curves:  # the slowest of more ranks is never faster
        points = sorted(c["points"], key=lambda p: p["cores"])
        assert points[0]["cores"] == 1 and points[-1]["cores"] == 16384
        steps = [p["step_ns"] for p in points]
        assert steps == sorted(steps), c["env"]
