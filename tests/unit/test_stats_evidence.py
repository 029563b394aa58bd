"""Evidence-of-cause statistics: FWQ noise detours and the guest clock check.

Expected values are worked out by hand from constructed data."""

from __future__ import annotations

import numpy as np
import pytest

from hpcvm.errors import BenchmarkError
from hpcvm.stats.noise import detour_threshold_ns, noise_summary
from hpcvm.stats.timekeeping import clock_drift


def _quanta() -> list[int]:
    """1000 quanta of 100 µs: 5 detours of 5 µs and one of 50 µs (noise), 3 jitters of
    0.5 µs and one of exactly 1 µs (not noise: the threshold is 'more than 1 µs')."""
    d = [100_000] * 1000
    for i in (10, 200, 400, 600, 800):
        d[i] += 5_000
    d[999] += 50_000
    for i in (1, 2, 3):
        d[i] += 500
    d[4] += 1_000
    return d


def test_noise_summary_on_constructed_quanta() -> None:
    s = noise_summary(_quanta())
    total = 1000 * 100_000 + 5 * 5_000 + 50_000 + 3 * 500 + 1_000
    assert (s.count, s.min_ns, s.threshold_ns) == (1000, 100_000, 1_000)
    assert s.detour_count == 6
    assert s.max_detour_ns == 50_000
    # every detour counts towards time lost, as csrc/noise.c computes it
    assert s.lost_fraction == pytest.approx((total - 1000 * 100_000) / total, rel=1e-12)
    # nearest rank: the ceil(0.999*1000) = 999th smallest detour is the largest 5 µs one
    assert s.p999_detour_ns == 5_000


def test_nearest_rank_percentile_on_small_samples() -> None:
    # n = 10: ceil(9.99) = 10th smallest, the maximum; n = 2000: the 1998th smallest
    assert noise_summary([100 + i for i in range(10)]).p999_detour_ns == 9
    assert noise_summary([1_000 + i for i in range(2000)]).p999_detour_ns == 1997


def test_order_does_not_matter_and_numpy_input_works() -> None:
    q = _quanta()
    assert noise_summary(np.array(q[::-1], dtype=np.int64)) == noise_summary(q)


def test_threshold_rule_and_override() -> None:
    assert detour_threshold_ns(10_000) == 1_000  # short quanta: the 1 µs floor
    assert detour_threshold_ns(1_000_000) == 10_000  # long quanta: 1% of the work time
    s = noise_summary(_quanta(), threshold_ns=400)
    assert s.threshold_ns == 400 and s.detour_count == 10


def test_quiet_cpu_has_no_detours() -> None:
    s = noise_summary([2_000_000] * 50)
    assert (s.detour_count, s.max_detour_ns, s.p999_detour_ns, s.lost_fraction) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("durations", "threshold"),
    [([], None), ([1.5, 2.0], None), ([100, 0, 100], None), ([100, -5], None), ([100], -1)],
)
def test_noise_bad_input(durations: list[float], threshold: int | None) -> None:
    with pytest.raises(BenchmarkError) as info:
        noise_summary(durations, threshold)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("host", "guest", "relative", "flagged"),
    [
        (100.0, 100.05, 0.0005, False),
        (100.0, 99.8, -0.002, True),  # the guest clock runs slow
        (10.0, 10.02, 0.002, True),
        (60.0, 60.0, 0.0, False),
    ],
)
def test_clock_drift(host: float, guest: float, relative: float, flagged: bool) -> None:
    d = clock_drift(host, guest)
    assert d.relative == pytest.approx(relative, rel=1e-9, abs=1e-15)
    assert d.flagged is flagged and d.limit == 0.001


@pytest.mark.parametrize(
    ("host", "guest"), [(0.0, 1.0), (-1.0, 1.0), (1.0, -1.0), (1.0, float("nan"))]
)
def test_clock_drift_bad_input(host: float, guest: float) -> None:
    with pytest.raises(BenchmarkError):
        clock_drift(host, guest)
