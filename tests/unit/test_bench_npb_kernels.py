"""NPB kernel data, class choice by --size, process-count rules and the resolution check
(pure functions; oracles: NPB's own rules restated by brute force, plain arithmetic)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpcvm.bench.core.resolution import coarse_resolution, resolution_warning
from hpcvm.bench.suites.npb.kernels import (
    CLASSES,
    KERNELS,
    check_process_count,
    class_for_size,
    larger_class,
    parse_selector,
)
from hpcvm.bench.suites.npb.suite import MOPS, TIME, NpbSuite
from hpcvm.errors import UsageError


def test_sizes_pick_growing_classes() -> None:
    picked = [class_for_size(size) for size in ("quick", "small", "medium")]
    assert picked == ["S", "W", "A"]
    assert [CLASSES.index(c) for c in picked] == sorted(CLASSES.index(c) for c in picked)
    for size in ("large", 0.05):
        with pytest.raises(UsageError, match="picks no NPB class"):
            class_for_size(size)


def test_larger_class() -> None:
    assert [larger_class(c) for c in CLASSES] == [*CLASSES[1:], None]


def _fits(rule: str, n: int) -> bool:
    """NPB's rules by brute force, independent of the bit tricks under test."""
    if rule == "square":
        return any(k * k == n for k in range(1, n + 1))
    if rule == "power-of-two":
        return any(2**k == n for k in range(n + 1))
    return True


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_process_rules_match_brute_force(kernel: str) -> None:
    rule = KERNELS[kernel][1]
    for n in range(1, 70):
        if _fits(rule, n):
            check_process_count(kernel, n)
            continue
        with pytest.raises(UsageError) as caught:
            check_process_count(kernel, n)
        suggested = int(str(caught.value).rsplit("--np ", 1)[1])
        assert _fits(rule, suggested) and suggested < n
        assert not any(_fits(rule, m) for m in range(suggested + 1, n))  # the largest below


def test_selectors() -> None:
    assert parse_selector("cg") == ("cg", None)
    assert parse_selector(" CG.b ") == ("cg", "B")
    with pytest.raises(UsageError, match=r"DT .* not run by hpcvm"):
        parse_selector("dt.S")


def test_coarse_resolution_against_one_percent_of_the_mean() -> None:
    assert coarse_resolution([0.04, 0.05, 0.04], 0.01)  # 0.01 is 23% of the mean
    assert coarse_resolution([0.0, 0.0], 0.01)  # all printed as 0.00
    assert not coarse_resolution([3.02, 3.05], 0.01)  # 0.3%
    assert coarse_resolution([0.9], 0.01)  # 1.1%
    assert not coarse_resolution([1.0], 0.01)  # exactly 1%: fine
    assert not coarse_resolution([], 0.01)
    assert coarse_resolution([3.02], 0.01, limit=0.001)


def test_resolution_warning_says_how_coarse_and_what_to_do() -> None:
    text = resolution_warning("CG time, np 1", [0.04, 0.04], 0.01, "s", "do X")
    assert text is not None
    percent = round(100 * 0.01 / 0.04)
    assert text == (
        f"CG time, np 1: printed in steps of 0.01 s, {percent}% of its mean 0.04 s, "
        "too coarse to compare at 1%: do X"
    )
    assert resolution_warning("CG time, np 1", [3.0], 0.01, "s", "do X") is None
    zero = resolution_warning("IS time, np 1", [0.0, 0.0], 0.01, "s", "do X")
    assert zero is not None and "every sample printed as 0" in zero


def test_suite_advice_uses_bench_options_that_exist() -> None:
    small = NpbSuite("cg", "S", {"x": Path("/npb/cg.S.x")})
    text = small.resolution_warning(TIME.name, 1, [0.04, 0.05])
    assert text is not None and text.startswith("CG time, np 1:")
    assert "--size small, or --npb-kernels cg.W" in text and "CG Mop/s" in text
    assert small.resolution_warning(MOPS.name, 1, [1800.0, 1750.0]) is None
    big = NpbSuite("is", "A", {"x": Path("/npb/is.A.x")})
    advice = big.resolution_warning(TIME.name, 2, [0.0])
    assert advice is not None and "--npb-kernels is.B" in advice and "--size" not in advice
    assert math.isclose(small.resolution(TIME.name) or 0, 0.01)
