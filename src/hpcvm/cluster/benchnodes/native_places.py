"""Where native ranks run on each node of ``bench --nodes``: each node's own PUs.

One-node benches confine native runs to the PUs and memory nodes the tuned VM's vCPUs
and memory are pinned to (bench/envs/placement.py). Across nodes every VM is planned on its
own node, from that node's topology (unlike nodes get unlike plans; on the one-machine
test cluster each node is a cpuset of its own), so the batch node's PUs say nothing of
the others'. Each node therefore computes its own native placement, as one-node bench
does, and reports the PUs its processes may use at all, in one step of the batch system
with a task per node (``python -m hpcvm.cluster.internal placement``).

How ranks are then bound is what Open MPI 4.1 can do. Its mpirun computes every
binding from its own node's topology (it assumes the nodes alike: checked on the test
cluster, a rankfile naming node 2's PU, physical or logical, fails or is refused on node
2, and ``--hetero-nodes`` is gone). So:

- every node's placement the same PUs (alike nodes, the usual cluster): ``--cpu-list``
  binds the ranks on every node to them (bench/core/launch.py's :func:`with_cpu_set`);
- placements that differ: ranks are dealt ``--map-by node --bind-to core`` as in the
  VMs, each inside what its node allows (its cgroup: Slurm's task/cgroup on a real
  cluster, the node's cpuset on the test cluster). Where a node allows more PUs than
  its VM uses, native may use them: :func:`differences` names such nodes, and the run
  records it beside the numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from hpcvm.bench.envs.placement import NativePlacement
from hpcvm.bench.run.config import BenchConfig
from hpcvm.cluster.batch.base import Allocation
from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.batch.spawn import internal_argv
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.model import Frozen, first_complaint
from hpcvm.units import format_cpu_list

STEP_NAME = "hpcvm-placement"
STEP_TIMEOUT = 300.0  # a step on every node; each reads its topology and plans


class NodeNative(Frozen):
    """One node's native placement and the PUs its processes may use at all."""

    placement: NativePlacement
    allowed: tuple[int, ...]


def this_node(config_json: str) -> str:
    """The JSON line a node's task prints: its name, placement and allowed PUs."""
    from hpcvm.bench.run.session import native_on
    from hpcvm.host import discover

    try:
        config = BenchConfig.model_validate_json(config_json)
    except ValidationError as exc:
        raise UsageError(
            f"placement: not a bench configuration ({first_complaint(exc).line()}); it is "
            "given by hpcvm bench --nodes, not typed"
        ) from None
    native = NodeNative(
        placement=native_on(config, discover()), allowed=tuple(sorted(os.sched_getaffinity(0)))
    )
    node = get_batch(config.batch).this_node(os.environ)
    return json.dumps({"node": node, **native.model_dump(mode="json")})


def each_node(allocation: Allocation, config: BenchConfig) -> dict[str, NodeNative]:
    """Every node's placement, by node name; RuntimeFailure naming what failed."""
    batch = get_batch(allocation.batch)
    argv = batch.step_argv(
        allocation, STEP_NAME, [*internal_argv("placement"), config.model_dump_json()]
    )
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=STEP_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(
            f"the nodes did not report their native PUs within {STEP_TIMEOUT:.0f} s"
        ) from None
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeFailure(
            f"could not learn each node's native PUs (step exit {proc.returncode}): {said}"
        )
    return parse(proc.stdout, allocation.nodes)


def parse(text: str, nodes: Sequence[str]) -> dict[str, NodeNative]:
    """The step's output lines, checked to hold one placement per node."""
    found: dict[str, NodeNative] = {}
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                item = json.loads(line)
                node = str(item.pop("node"))
                found[node] = NodeNative.model_validate(item)
            except (ValueError, KeyError, ValidationError) as exc:
                raise RuntimeFailure(f"a node's native placement is garbled: {exc}") from None
    missing = [n for n in nodes if n not in found]
    if missing:
        raise RuntimeFailure(f"no native placement came back from node(s) {', '.join(missing)}")
    return {n: found[n] for n in nodes}


def common_cpus(places: Mapping[str, NodeNative]) -> tuple[int, ...] | None:
    """The PUs to bind ranks to on every node (``--cpu-list``): the placement when
    every node has the same one, else None (module doc)."""
    cpus = {p.placement.cpus for p in places.values()}
    return cpus.pop() if len(cpus) == 1 else None


def used(native: NodeNative, common: tuple[int, ...] | None) -> tuple[int, ...]:
    """The PUs a node's native ranks may run on."""
    return common if common is not None else native.allowed


def describe(places: Mapping[str, NodeNative]) -> str:
    """``node1: PUs 0, mems 0; node2: PUs 1, mems 0``: where native ran, per node."""
    common = common_cpus(places)
    return "; ".join(
        f"{node}: PUs {format_cpu_list(list(used(p, common)))}, "
        f"mems {format_cpu_list(list(p.placement.mems))}"
        for node, p in places.items()
    )


def differences(places: Mapping[str, NodeNative]) -> list[str]:
    """Nodes whose native ranks may use other PUs than their VM's (module doc)."""
    common = common_cpus(places)
    return [
        f"native on {node} may use PUs {format_cpu_list(list(used(p, common)))}, its VM's "
        f"vCPUs PUs {format_cpu_list(list(p.placement.cpus))} (Open MPI binds alike nodes "
        "only: confine each node's jobs to its VM's PUs with a cgroup to compare like for like)"
        for node, p in places.items()
        if p.placement.cpus is not None and set(used(p, common)) != set(p.placement.cpus)
    ]
