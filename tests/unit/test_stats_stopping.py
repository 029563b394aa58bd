"""fixed_width_stop(): the fixed-width sequential rule behind --reps auto.

The expected stopping n is computed here independently, with the standard library's
statistics module and scipy's t.interval, by walking the sequence until the half-width
condition first holds.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from scipy import stats as sps

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.stats.stopping import StopDecision, fixed_width_stop, replay_auto

TARGET = 0.01


def _expected_stop(values: list[float], target: float, n_min: int, conf: float = 0.97) -> int:
    for n in range(n_min, len(values) + 1):
        head = values[:n]
        mean = statistics.fmean(head)
        low, high = sps.t.interval(conf, n - 1, loc=mean, scale=sps.sem(head))
        if (high - low) / 2 <= target * abs(mean):
            return n
    raise AssertionError("the sequence never meets the target; make it longer")


def _first_stop(values: list[float], **kw: object) -> StopDecision:
    for n in range(1, len(values) + 1):
        d = fixed_width_stop({"time": values[:n]}, elapsed=0.0, max_time=None, **kw)  # type: ignore[arg-type]
        if d.stop:
            return d
    raise AssertionError("never stopped")


def test_alternating_sequence_with_known_sd() -> None:
    """100 ± 3 alternately: for even n, s = 3*sqrt(n/(n-1)) and the half-width is
    t(n-1)*3/sqrt(n-1); the 1% target (1.0) first holds a little past n = 2+(2.2*3)^2."""
    values = [100.0 + (3.0 if i % 2 == 0 else -3.0) for i in range(200)]
    expected = _expected_stop(values, TARGET, n_min=3)
    assert 40 < expected < 60  # the sequence is non-trivial for the rule
    d = _first_stop(values, target=TARGET, n_max=200)
    assert (d.n, d.reason, d.worst_metric) == (expected, "target", "time")
    assert d.worst_relative_half_width <= TARGET


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_seeded_normal_sequence(seed: int) -> None:
    values = np.random.default_rng(seed).normal(50.0, 1.5, size=400).tolist()  # CV 3%
    expected = _expected_stop(values, TARGET, n_min=3)
    d = _first_stop(values, target=TARGET, n_max=400)
    assert (d.n, d.reason) == (expected, "target")


def test_every_metric_must_meet_the_target() -> None:
    rng = np.random.default_rng(5)
    tight = rng.normal(10.0, 0.01, size=300).tolist()
    loose = rng.normal(10.0, 0.4, size=300).tolist()
    expected = _expected_stop(loose, TARGET, n_min=3)
    n = expected - 1
    before = fixed_width_stop(
        {"tight": tight[:n], "loose": loose[:n]}, target=TARGET, n_max=300, elapsed=0, max_time=None
    )
    assert not before.stop and before.reason == "continue" and before.worst_metric == "loose"
    n = expected
    at = fixed_width_stop(
        {"tight": tight[:n], "loose": loose[:n]}, target=TARGET, n_max=300, elapsed=0, max_time=None
    )
    assert at.stop and at.reason == "target" and at.worst_metric == "loose"


def test_minimum_is_honoured_even_with_zero_spread() -> None:
    d = _first_stop([7.0] * 10, target=TARGET, n_min=4, n_max=10)
    assert (d.n, d.reason, d.worst_relative_half_width) == (4, "target", 0.0)


def test_repetition_cap() -> None:
    noisy = np.random.default_rng(9).normal(10.0, 5.0, size=20).tolist()
    d = _first_stop(noisy, target=TARGET, n_max=12)
    assert (d.stop, d.reason, d.n) == (True, "max-reps", 12)
    assert d.worst_relative_half_width > TARGET


def test_time_cap_after_the_minimum_only() -> None:
    noisy = [10.0, 14.0, 6.0, 12.0, 9.0]
    early = fixed_width_stop({"t": noisy[:2]}, target=TARGET, n_max=50, elapsed=99, max_time=10)
    assert not early.stop and early.reason == "continue"
    late = fixed_width_stop({"t": noisy}, target=TARGET, n_max=50, elapsed=10, max_time=10)
    assert late.stop and late.reason == "max-time"
    in_time = fixed_width_stop({"t": noisy}, target=TARGET, n_max=50, elapsed=9.9, max_time=10)
    assert not in_time.stop


def test_target_is_reported_when_met_at_a_cap() -> None:
    d = fixed_width_stop({"t": [5.0, 5.0, 5.0]}, target=TARGET, n_max=3, elapsed=99, max_time=1)
    assert d.reason == "target"


def test_failed_runs_do_not_block_the_caps() -> None:
    """A metric with fewer samples (failed runs) cannot meet the target below n_min, but
    the repetition count (the longest sample, or reps=) still reaches the cap."""
    d = fixed_width_stop(
        {"ok": [1.0, 1.0, 1.0, 1.0], "flaky": [1.0]},
        target=TARGET,
        n_max=4,
        elapsed=0,
        max_time=None,
    )
    assert (d.reason, d.worst_metric) == ("max-reps", "flaky")
    d = fixed_width_stop(
        {"ok": [1.0] * 3}, target=TARGET, n_max=5, reps=5, elapsed=0, max_time=None
    )
    assert d.reason == "target"


def test_replay_matches_the_independent_walk() -> None:
    rng = np.random.default_rng(21)
    a = rng.normal(100.0, 2.0, size=50).tolist()
    b = rng.normal(20.0, 0.1, size=50).tolist()
    expected = max(_expected_stop(a, TARGET, 3), _expected_stop(b, TARGET, 3))
    r = replay_auto({"a": a, "b": b}, target=TARGET)
    assert (r.decision.n, r.decision.reason, r.n_available) == (expected, "target", 50)
    assert max(r.relative_half_width_at_stop.values()) <= TARGET
    assert r.relative_half_width_at_end["a"] < r.relative_half_width_at_stop["a"]


def test_replay_never_meeting_the_target_stops_at_the_cap() -> None:
    noisy = np.random.default_rng(3).normal(10.0, 5.0, size=30).tolist()
    r = replay_auto({"t": noisy}, target=TARGET, n_max=20)
    assert (r.decision.reason, r.decision.n) == ("max-reps", 20)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"target": 0.0}, UsageError),
        ({"target": 1.5}, UsageError),
        ({"n_min": 1}, UsageError),
        ({"n_max": 2}, UsageError),
        ({"max_time": 0.0}, UsageError),
        ({"confidence": 0.0}, UsageError),
        ({"samples_by_metric": {}}, BenchmarkError),
        ({"samples_by_metric": {"t": [1.0, float("nan")]}}, BenchmarkError),
    ],
)
def test_bad_input(kwargs: dict[str, object], error: type[Exception]) -> None:
    args: dict[str, object] = {
        "samples_by_metric": {"t": [1.0, 2.0, 3.0]},
        "target": TARGET,
        "n_max": 10,
        "elapsed": 0.0,
        "max_time": None,
    }
    args.update(kwargs)
    with pytest.raises(error) as info:
        fixed_width_stop(**args)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
