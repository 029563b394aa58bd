"""How long plan() takes on a 1024-PU, 16-node host (issue 8: well under 0.2 s).

A script, not a test (timings on a shared, noisy machine are not assertions). It builds
the host once with hwloc's synthetic input ("pack:4 numa:4 core:32 pu:2": 4 packages x
4 nodes x 32 cores x 2 threads), gives every node 64G and free huge pages so that every
profile can plan, then times plan() for each profile with all usable PUs (minus the
housekeeping cores for hpc), then the node searches issue 8 added (half the cores with
each --smt policy, and a memory size that forces more nodes than the CPUs need), and
prints the median of several runs and its ratio to the budget.

    .venv/bin/python benchmarks/plan_scale.py [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

from hpcvm.host import HostTopology, synthetic
from hpcvm.host.model import HugePagePool
from hpcvm.plan import PROFILES, plan
from hpcvm.plan.model import PlanRequest
from hpcvm.units import GIB, MIB

DESCRIPTION = "pack:4 numa:4 core:32 pu:2"
BUDGET_S = 0.2


def roomy_host() -> HostTopology:
    host = synthetic(DESCRIPTION)
    pools = (HugePagePool(size_bytes=2 * MIB, total=16384, free=16384),)
    nodes = tuple(
        n.model_copy(update={"memory_bytes": 64 * GIB, "hugepages": pools}) for n in host.nodes
    )
    return host.model_copy(update={"nodes": nodes})


def vcpus_for(host: HostTopology, profile: str) -> int:
    """All usable PUs; hpc keeps one core per node for housekeeping."""
    usable = len(host.usable_pus())
    if profile != "hpc":
        return usable
    per_core = {len(c.pus) for c in host.cores}.pop()
    return usable - per_core * len(host.nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="timed runs per profile")
    args = parser.parse_args()
    host = roomy_host()
    print(f"host: {DESCRIPTION}: {len(host.pus)} PUs, {len(host.nodes)} NUMA nodes")
    print(f"{'profile':<12} {'vCPUs':>6} {'median s':>10} {'min s':>8} {'x budget':>9}")
    worst = 0.0
    cases = [
        (name, {"profile": name, "vcpus": vcpus_for(host, name), "memory_bytes": 16 * GIB})
        for name in PROFILES
    ]
    for smt in ("cores", "pack", "require"):
        cases.append(
            (f"numa {smt}", {"profile": "numa", "vcpus": 256, "memory_bytes": 16 * GIB, "smt": smt})
        )
    # 4 vCPUs with 100G: one node holds the CPUs, memory needs four (32G of pages each)
    cases.append(("numa mem", {"profile": "numa", "vcpus": 4, "memory_bytes": 100 * GIB}))
    for name, spec in cases:
        request = PlanRequest.model_validate(spec)
        plan(host, request)  # warm-up (imports, pydantic schema caches)
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            plan(host, request)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        worst = max(worst, median)
        print(
            f"{name:<12} {request.vcpus:>6} {median:>10.4f} {min(times):>8.4f} "
            f"{median / BUDGET_S:>9.3f}"
        )
    verdict = "within" if worst < BUDGET_S else "OVER"
    print(
        f"slowest median {worst:.4f} s: {verdict} the {BUDGET_S} s budget ({worst / BUDGET_S:.1%})"
    )


if __name__ == "__main__":
    main()
