"""How long plan() takes on a 1024-PU, 16-node host (issue 2: under 0.5 s).

A script, not a test (timings on a shared, noisy machine are not assertions). It builds
the host once with hwloc's synthetic input ("pack:4 numa:4 core:32 pu:2": 4 packages x
4 nodes x 32 cores x 2 threads), gives every node 64G and free huge pages so that every
profile can plan, then times plan() for each profile with all usable PUs (minus the
housekeeping cores for hpc) and prints the median of several runs and its ratio to the
budget.

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
BUDGET_S = 0.5


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
    print(f"{'profile':<10} {'vCPUs':>6} {'median s':>10} {'min s':>8} {'x budget':>9}")
    worst = 0.0
    for name in PROFILES:
        request = PlanRequest.model_validate(
            {"profile": name, "vcpus": vcpus_for(host, name), "memory_bytes": 16 * GIB}
        )
        plan(host, request)  # warm-up (imports, pydantic schema caches)
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            plan(host, request)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        worst = max(worst, median)
        print(
            f"{name:<10} {request.vcpus:>6} {median:>10.4f} {min(times):>8.4f} "
            f"{median / BUDGET_S:>9.3f}"
        )
    verdict = "within" if worst < BUDGET_S else "OVER"
    print(
        f"slowest median {worst:.4f} s: {verdict} the {BUDGET_S} s budget ({worst / BUDGET_S:.1%})"
    )


if __name__ == "__main__":
    main()
