"""interleaved_order(): a fresh, reproducible random order of environments per block."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from hpcvm.errors import UsageError
from hpcvm.stats.interleave import interleaved_order, interleaved_schedule

ENVS = ["native", "vm:naive", "vm:hpc"]


def test_each_block_is_a_permutation() -> None:
    for block in range(20):
        assert sorted(interleaved_order(ENVS, block, seed=1)) == sorted(ENVS)


def test_orders_vary_between_blocks_and_positions_are_balanced() -> None:
    """Over 600 blocks each environment should run first about 1/3 of the time (binomial
    sd 0.019: the bounds are over 4 sd away) and all 6 orders should occur."""
    schedule = interleaved_schedule(ENVS, 600, seed=42)
    assert len({tuple(o) for o in schedule}) == 6
    for position in range(3):
        counts = Counter(order[position] for order in schedule)
        for env in ENVS:
            assert 0.25 < counts[env] / 600 < 0.42


def test_deterministic_and_resumable() -> None:
    full = interleaved_schedule(ENVS, 10, seed=7)
    assert interleaved_order(ENVS, 9, seed=7) == full[9]  # without computing blocks 0-8
    assert interleaved_schedule(ENVS, 10, seed=7) == full
    assert interleaved_schedule(ENVS, 10, seed=8) != full


def test_same_order_in_another_process_with_another_hash_seed() -> None:
    code = (
        "from hpcvm.stats.interleave import interleaved_schedule;"
        f"print(interleaved_schedule({ENVS!r}, 5, seed=3))"
    )
    outs = set()
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.add(res.stdout)
    assert outs == {f"{interleaved_schedule(ENVS, 5, seed=3)}\n"}


def test_input_order_is_not_modified_and_empty_is_empty() -> None:
    envs = list(ENVS)
    interleaved_order(envs, 0, seed=1)
    assert envs == ENVS
    assert interleaved_order([], 0, seed=1) == []


@pytest.mark.parametrize(("envs", "block"), [(["a", "b", "a"], 0), (["a", "b"], -1)])
def test_bad_input(envs: list[str], block: int) -> None:
    with pytest.raises(UsageError) as info:
        interleaved_order(envs, block, seed=1)
    assert "\n" not in str(info.value)
