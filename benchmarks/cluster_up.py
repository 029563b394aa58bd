"""How long `hpcvm cluster up` takes until every guest answers, for 1 and 2 nodes, as
a ratio to one `hpcvm up` of the same VM measured in the same run.

Runs on the one-machine Slurm test cluster (scripts/test-cluster.sh; started here if it
is not up, and then stopped again). Each repetition block runs, in a fresh random order
(hpcvm.stats.interleaved_order): a single `hpcvm up` on node1 (in node1's namespace,
with a tap in its bridge, exactly as a cluster node boots its VM), and `cluster up`
inside a batch job of 1 and of 2 nodes. The cluster times are taken inside the batch
script around the `cluster up` command alone (Slurm's scheduling of the job is not
counted); each is followed by `cluster down`. All VMs: hpc profile, 1 vCPU, 256 MiB,
TCG. Printed: mean seconds with their 97% Student-t interval, and the ratio to the
single `up` with its Fieller interval (hpcvm.stats.overhead, lower is better), then
where the time goes: each run's marks (hpcvm.timeline, ``HPCVM_TIMELINE``: the client,
the holder, each node's task and ``up`` itself mark their steps) as mean seconds since
the run's start (for 2 nodes, the later node's), so the extra seconds of `cluster up`
are found between two marks.

On the one-machine cluster the nodes share 2 cores, so two nodes boot two TCG guests
on the same cores at once: the 2-node ratio there bounds what a real cluster (one
guest per machine, in parallel) would show from above. There each node is a cpuset of
one PU, too few for the hpc profile's housekeeping core beside a vCPU: when a node has
a single PU (``nproc`` in its cgroup), every VM here is planned with
``--housekeeping 0``, as `hpcvm up` itself suggests on such a host.

    .venv/bin/python benchmarks/cluster_up.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcvm.stats import interleaved_order, overhead, summarize

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "test-cluster.sh"
HPCVM = str(Path(sys.executable).parent / "hpcvm")
VM_SHAPE = ["--profile", "hpc", "--vcpus", "1", "--memory", "256M", "--accel", "tcg"]
NET = ["--network", "bridge=br0", "--address", "10.77.0.150/24"]
CONF = 0.97
KINDS = ("single up", "cluster up, 1 node", "cluster up, 2 nodes")

JOB = """#!/bin/sh
set -e
export HPCVM_TIMELINE={timeline}
t0=$(date +%s.%N)
{hpcvm} cluster up --name {name} {vm} --address 10.77.0.101/24 >&2
t1=$(date +%s.%N)
{hpcvm} cluster down {name} >&2
echo "seconds $t0 $t1"
"""


def cluster(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        sys.exit(f"test-cluster.sh {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done


def vm_options(nodes: int) -> list[str]:
    """The VM's options: ``--housekeeping 0`` when a node has one PU (module doc)."""
    pus = [
        int(cluster("exec", "--node", f"node{i}", "--", "nproc").stdout.split()[0])
        for i in range(1, nodes + 1)
    ]
    return [*VM_SHAPE, "--housekeeping", "0"] if min(pus) < 2 else list(VM_SHAPE)


Marks = dict[str, float]  # what -> seconds since the run's start


def read_marks(path: Path, t0: float) -> Marks:
    """A run's timeline (hpcvm.timeline) as seconds since ``t0``; a mark made on
    several nodes counts at its latest (the slowest node sets the pace)."""
    marks: Marks = {}
    if not path.exists():
        return marks
    for line in path.read_text().splitlines():
        seconds, _pid, what = line.split(" ", 2)
        marks[what] = max(marks.get(what, float("-inf")), float(seconds) - t0)
    path.unlink()
    return marks


def single_up(workdir: Path, vm: list[str]) -> tuple[float, Marks]:
    """One `hpcvm up` on node1, timed from outside (the command's whole run)."""
    timeline = workdir / "timeline-single.txt"
    argv = ["exec", "--node", "node1", "--", "env", f"--chdir={workdir}"]
    argv += [f"HPCVM_TIMELINE={timeline}", HPCVM, "up"]
    t0 = time.time()
    begin = time.monotonic()
    cluster(*argv, "--name", "bench-single", *vm, *NET)
    seconds = time.monotonic() - begin
    cluster("exec", "--node", "node1", "--", HPCVM, "down", "bench-single")
    return seconds, read_marks(timeline, t0)


def cluster_up(workdir: Path, nodes: int, rep: int, vm: list[str]) -> tuple[float, Marks]:
    """`cluster up` in a batch job of ``nodes`` nodes, timed inside the job."""
    job = workdir / f"job{nodes}-{rep}.sh"
    timeline = workdir / f"timeline-{nodes}-{rep}.txt"
    text = JOB.format(hpcvm=HPCVM, name=f"b{nodes}r{rep}", vm=" ".join(vm), timeline=timeline)
    job.write_text(text)
    out = workdir / f"job{nodes}-{rep}.out"
    argv = ["sbatch", "-N", str(nodes), "--wait", f"--chdir={workdir}", f"--output={out}"]
    done = cluster("exec", "--", *argv, str(job), check=False)
    text = out.read_text() if out.exists() else ""
    line = next((ln for ln in text.splitlines() if ln.startswith("seconds ")), None)
    if done.returncode != 0 or line is None:
        sys.exit(f"cluster up on {nodes} node(s) failed:\n{done.stderr}\n{text}")
    _, t0, t1 = line.split()
    return float(t1) - float(t0), read_marks(timeline, float(t0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    was_up = cluster("status", check=False).returncode == 0
    if not was_up:  # a running test cluster (the tests' 4 nodes) serves as it is
        cluster("up", "--nodes", "2")
    vm = vm_options(2)
    print(f"VM: {' '.join(vm)}", file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="hpcvm-cluster-up-", dir="/var/tmp"))
    workdir.chmod(0o755)
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    marks: dict[str, list[Marks]] = {k: [] for k in KINDS}
    try:
        for block in range(args.reps + 1):
            for kind in interleaved_order(KINDS, block, seed=11):
                if kind == KINDS[0]:
                    seconds, seen = single_up(workdir, vm)
                else:
                    seconds, seen = cluster_up(workdir, 1 if kind == KINDS[1] else 2, block, vm)
                if block > 0:  # block 0 warms caches (guest image, page cache)
                    times[kind].append(seconds)
                    marks[kind].append(seen)
                print(f"block {block} {kind}: {seconds:.2f} s", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if not was_up:
            cluster("down", check=False)
    report(times, args.reps)
    breakdown(marks)


def report(times: dict[str, list[float]], reps: int) -> None:
    print(f"# cluster up until every guest answers ({platform.node()}, {os.cpu_count()} CPUs,")
    print(f"# TCG, hpc profile 1 vCPU 256 MiB, {reps} repetitions, {CONF * 100:g}% intervals)")
    print(f"{'':22} {'mean s':>8} {'interval':>17} {'ratio to up':>12} {'interval':>17}")
    base = times[KINDS[0]]
    for kind in KINDS:
        s = summarize(times[kind], CONF)
        ratio = overhead(base, times[kind], higher_is_better=False, confidence=CONF)
        interval = f"{s.ci_low:.2f}-{s.ci_high:.2f}" if s.ci_low is not None else "-"
        r_int = (
            f"{ratio.ratio_ci_low:.2f}-{ratio.ratio_ci_high:.2f}"
            if ratio.ratio_ci_low is not None and ratio.ratio_ci_high is not None
            else "unbounded"
        )
        print(f"{kind:22} {s.mean:8.2f} {interval:>17} {ratio.ratio:12.2f} {r_int:>17}")


def breakdown(marks: dict[str, list[Marks]]) -> None:
    """Each mark's mean seconds since its run's start, per kind, in the order they come
    (module doc); '-' where a kind has no such mark."""
    names = sorted(
        {w for runs in marks.values() for m in runs for w in m},
        key=lambda w: min(m[w] for runs in marks.values() for m in runs if w in m),
    )
    print("\n# where the time goes: mean seconds since the run's start")
    print(f"{'mark':34}" + "".join(f"{k:>22}" for k in KINDS))
    for w in names:
        cells = []
        for kind in KINDS:
            got = [m[w] for m in marks[kind] if w in m]
            cells.append(f"{sum(got) / len(got):22.3f}" if got else f"{'-':>22}")
        print(f"{w:34}" + "".join(cells))


if __name__ == "__main__":
    main()
