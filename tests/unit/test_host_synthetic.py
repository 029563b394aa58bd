"""synthetic(): hwloc synthetic descriptions through the same parser as real hosts,
for the planner's property tests and scale benchmark."""

from __future__ import annotations

import math
import re

import pytest

from hpcvm.errors import TopologyError
from hpcvm.host import synthetic
from hpcvm.units import GIB


def _levels(description: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+):(\d+)", description)}


@pytest.mark.parametrize(
    "description",
    ["pack:2 numa:2 core:8 pu:2", "pack:1 numa:4 l3:2 core:4 pu:1", "pack:4 numa:1 core:6 pu:4"],
)
def test_counts_follow_the_description(description: str) -> None:
    levels = _levels(description)
    host = synthetic(description)
    assert host.source == f"synthetic:{description}"
    assert len(host.packages) == levels["pack"]
    assert len(host.nodes) == levels["pack"] * levels["numa"]
    cores = math.prod(v for k, v in levels.items() if k != "pu")
    assert len(host.cores) == cores
    assert len(host.pus) == cores * levels["pu"]
    assert all(len(c.pus) == levels["pu"] for c in host.cores)
    assert host.kvm.usable is False and host.kvm.device is None


def test_the_planners_reference_shape() -> None:
    host = synthetic("pack:2 numa:2 core:8 pu:2")
    assert (len(host.packages), len(host.nodes), len(host.cores), len(host.pus)) == (2, 4, 32, 64)
    for node in host.nodes:
        assert len(node.pus) == 16


def test_memory_per_node() -> None:
    host = synthetic("pack:2 numa:2(memory=64GiB) core:2 pu:1")
    assert [n.memory_bytes for n in host.nodes] == [64 * GIB] * 4


def test_scale_1024_pus_16_nodes() -> None:
    """The planner's benchmark shape (timed by its benchmark script, not here)."""
    host = synthetic("pack:4 numa:4(memory=16GiB) core:32 pu:2")
    assert len(host.pus) == 1024 and len(host.nodes) == 16
    assert len(host.distances) == 16 and all(len(r) == 16 for r in host.distances)


def test_bad_description_is_a_topology_error() -> None:
    with pytest.raises(TopologyError, match="synthetic"):
        synthetic("pack:2 gizmo:3 pu:1")
