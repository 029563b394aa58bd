"""Issue 36: the largest ``--memory`` a refusal names plans, as typed back, on the same
host; sizes people only read are in human units (23.5G, not 24684092K).

Every snapshot in ../shared/topologies/ as recorded, with few free huge pages, with
none, and under a memory limit, and this host as it is now; every profile; requests far
beyond the host's RAM and just beyond it. The size is taken from the message's text and
parsed as the CLI parses ``--memory``: whatever the planner's rounding, page size, free
pages, split over nodes or memory limit, planning it must succeed.
"""

from __future__ import annotations

import re

import pytest

from hpcvm.errors import HpcvmError, InfeasiblePlanError
from hpcvm.host import HostTopology, discover
from hpcvm.plan import plan
from hpcvm.plan.model import PROFILE_NAMES, PlanRequest
from hpcvm.units import GIB, MIB, TIB, parse_size
from tests.conftest import Snapshot
from tests.plan_checks import host_from, with_pools

NAMED = re.compile(r"use --memory (\S+) or less")
RAW = re.compile(r"\d{5,}[KB]\b")  # a size no one reads at a glance: 24684092K


def _variants(host: HostTopology) -> dict[str, HostTopology]:
    few = with_pools(host, 2 * MIB, total=600, free=300)
    return {
        "as-recorded": host,
        "few-free-2M": few,
        "no-free-2M": with_pools(host, 2 * MIB, total=0, free=0),
        "limit-3G": few.model_copy(update={"memory_limit": 3 * GIB}),
    }


def _sizes(host: HostTopology) -> list[int]:
    ram = sum(n.memory_bytes for n in host.allowed_nodes())
    return [4 * TIB, (ram // MIB + 64) * MIB, (ram // 2 // MIB) * MIB]


def _check(host: HostTopology, request: PlanRequest) -> bool:
    """Plan ``request``; when refused for its memory, plan the size the refusal names.
    True when a size was named."""
    try:
        plan(host, request)
    except InfeasiblePlanError as exc:
        text = exc.message
        assert not RAW.search(text), text
        found = NAMED.search(text)
        if found is None:
            return False
        size = parse_size(found.group(1), what="--memory")
        assert size < request.memory_bytes, text
        again = request.model_copy(update={"memory_bytes": size})
        try:
            plan(host, again)
        except HpcvmError as next_refusal:
            pytest.fail(f"{text}\n  but --memory {found.group(1)} is refused: {next_refusal}")
        return True
    except HpcvmError:
        return False  # refused for something else (vCPUs, page size the host lacks)
    return False


def _run(host: HostTopology) -> int:
    named = 0
    usable = len(host.usable_pus())
    for label, variant in _variants(host).items():
        for profile in PROFILE_NAMES:
            for vcpus in sorted({1, max(1, usable // 2)}):
                for size in _sizes(variant):
                    request = PlanRequest.model_validate(
                        {
                            "name": label,
                            "profile": profile,
                            "vcpus": vcpus,
                            "memory_bytes": size,
                            "accel": "tcg",
                        }
                    )
                    named += _check(variant, request)
    return named


def test_named_memory_plans_on_every_snapshot(snapshot: Snapshot) -> None:
    host = host_from(snapshot.kind, str(snapshot.path))
    named = _run(host)
    if any(n.memory_bytes for n in host.allowed_nodes()):
        assert named > 0  # the test saw refusals that name a size


def test_named_memory_plans_on_this_host() -> None:
    assert _run(discover()) > 0


def test_host_ram_is_read_in_human_units() -> None:
    """The message that was '24684092K of RAM' on a 23.5G host."""
    host = discover()
    ram = sum(n.memory_bytes for n in host.allowed_nodes())
    request = PlanRequest(profile="hugepages", vcpus=1, memory_bytes=4 * TIB, accel="tcg")
    with pytest.raises(InfeasiblePlanError) as info:
        plan(host, request)
    shown = re.search(r"this host's (\S+) of RAM", info.value.message)
    assert shown is not None, info.value.message
    assert shown.group(1) in {f"{ram / GIB:.1f}G", f"{ram // GIB}G"}, info.value.message
