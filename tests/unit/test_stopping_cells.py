"""fixed_width_stop() as ``--reps auto`` uses it per cell: extreme statistics left out,
and a cell that cannot reach its target in the time left giving its time back.

The oracle is scipy's t.interval, walked sample by sample here; the projection is
checked against the smallest n at which a sequence with the same mean and standard
deviation would meet the target, found here by a plain search with scipy's t quantile.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats as sps

from hpcvm.bench.suites.noise.suite import METRICS as NOISE_METRICS
from hpcvm.errors import BenchmarkError
from hpcvm.stats.stopping import (
    fixed_width_stop,
    projected_seconds,
    relative_half_width,
    repetitions_needed,
)

TARGET = 0.1
CONF = 0.97


def _half_width_ok(values: list[float]) -> bool:
    n = len(values)
    mean = statistics.fmean(values)
    low, high = sps.t.interval(CONF, n - 1, loc=mean, scale=sps.sem(values))
    return (high - low) / 2 <= TARGET * abs(mean)


def _oracle_stop(values: list[float], n_min: int = 3) -> int:
    for n in range(n_min, len(values) + 1):
        if _half_width_ok(values[:n]):
            return n
    raise AssertionError("the stream never meets the target; make it longer")


def test_an_extreme_statistic_is_left_out_and_named() -> None:
    """A steady mean-like metric meets 10% at the n scipy says; a max-like metric of
    heavy-tailed samples never would, and must not hold the cell up."""
    rng = np.random.default_rng(7)
    steady = rng.normal(100.0, 25.0, size=200).tolist()  # CV 25%: tens of repetitions
    wild = (rng.pareto(1.1, size=200) * 1000.0 + 1.0).tolist()
    expected = _oracle_stop(steady)
    assert expected > 10  # the stream is non-trivial for the rule
    assert not _half_width_ok(wild[:expected])  # judging it would not have stopped here
    for n in range(1, expected + 1):
        d = fixed_width_stop(
            {"steady": steady[:n], "wild": wild[:n]},
            target=TARGET,
            n_max=200,
            elapsed=0.0,
            max_time=None,
            extreme={"wild"},
        )
        assert d.stop == (n == expected), n
    assert (d.reason, d.worst_metric, d.left_out) == ("target", "steady", ("wild",))


def test_only_extreme_metrics_is_an_error_that_says_so() -> None:
    with pytest.raises(BenchmarkError, match="extreme"):
        fixed_width_stop(
            {"max": [1.0, 2.0, 3.0]},
            target=TARGET,
            n_max=10,
            elapsed=0.0,
            max_time=None,
            extreme={"max"},
        )


def test_the_noise_suites_extremes_are_data_on_its_metrics() -> None:
    extreme = {m.name for m in NOISE_METRICS if m.extreme}
    assert extreme == {"NoiseMaxDetour_usec", "NoiseP999Detour_usec"}


def _needed(values: list[float]) -> int:
    """Smallest n whose interval, with this mean and sd, is within the target."""
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    n = 2
    while sps.t.ppf(1 - (1 - CONF) / 2, n - 1) * sd / math.sqrt(n) > TARGET * mean:
        n += 1
    return n


@pytest.mark.parametrize("seconds", [1.0, 30.0])
def test_a_cell_that_cannot_reach_its_target_in_time_gives_way(seconds: float) -> None:
    """Five samples with CV 35% need ~60 repetitions; at 1 s each they fit in the 200 s
    left beside the 50 s cheaper cells need, at 30 s each they do not: that cell gives
    way (it does not stop: the time cheaper cells leave is still its to use)."""
    values = [60.0, 140.0, 100.0, 70.0, 130.0]
    needed = _needed(values)
    assert 50 < needed < 150
    d = fixed_width_stop(
        {"t": values},
        target=TARGET,
        n_max=200,
        elapsed=100.0,
        max_time=300.0,
        seconds_per_rep=seconds,
        reserved=50.0,
    )
    fits = (needed - len(values)) * seconds <= 150.0
    assert fits == (seconds == 1.0)  # the two cases are on either side of the line
    assert (d.stop, d.reason, d.give_way) == (False, "continue", not fits)


def test_a_cell_that_cannot_fit_even_alone_gives_way() -> None:
    """No cheaper cell waits, but ~55 more samples of 30 s cannot fit in 200 s: the
    cell gives way all the same (the runner lets it run when every open cell waits)."""
    values = [60.0, 140.0, 100.0, 70.0, 130.0]
    kw: dict[str, object] = {"target": TARGET, "n_max": 200, "elapsed": 100.0}
    dear = fixed_width_stop({"t": values}, max_time=300.0, seconds_per_rep=30.0, **kw)  # type: ignore[arg-type]
    assert (dear.stop, dear.give_way) == (False, True)
    cheap = fixed_width_stop({"t": values}, max_time=300.0, seconds_per_rep=1.0, **kw)  # type: ignore[arg-type]
    assert (cheap.stop, cheap.give_way) == (False, False)


def test_a_target_beyond_the_repetition_cap_gives_way_even_without_a_time_cap() -> None:
    """~60 repetitions needed, 10 allowed: the cells that can still meet their target go
    first; the time is no object here."""
    values = [60.0, 140.0, 100.0, 70.0, 130.0]
    kw: dict[str, object] = {"target": TARGET, "elapsed": 0.0, "max_time": None}
    capped = fixed_width_stop({"t": values}, n_max=10, seconds_per_rep=0.1, **kw)  # type: ignore[arg-type]
    assert (capped.stop, capped.give_way) == (False, True)
    roomy = fixed_width_stop({"t": values}, n_max=1000, seconds_per_rep=0.1, **kw)  # type: ignore[arg-type]
    assert (roomy.stop, roomy.give_way) == (False, False)
    unpriced = fixed_width_stop({"t": values}, n_max=10, **kw)  # type: ignore[arg-type]
    assert not unpriced.give_way  # without a cost the caller asked for no projection


def test_no_projection_before_the_minimum_or_without_a_cap() -> None:
    values = [60.0, 140.0]
    early = fixed_width_stop(
        {"t": values},
        target=TARGET,
        n_max=50,
        elapsed=0.0,
        max_time=10.0,
        seconds_per_rep=99,
        reserved=5.0,
    )
    assert not early.stop and not early.give_way
    uncapped = fixed_width_stop(
        {"t": [*values, 100.0]},
        target=TARGET,
        n_max=5000,
        elapsed=0.0,
        max_time=None,
        seconds_per_rep=99,
        reserved=5.0,
    )
    assert not uncapped.stop and not uncapped.give_way


def test_repetitions_needed_matches_a_plain_search() -> None:
    values = [60.0, 140.0, 100.0, 70.0, 130.0]
    width = relative_half_width(values, CONF)
    assert repetitions_needed(width, len(values), TARGET, CONF) == _needed(values)
    assert repetitions_needed(0.05, 7, TARGET, CONF) == 7  # already there
    assert repetitions_needed(math.inf, 1, TARGET, CONF) == math.inf


def test_projected_seconds_stop_at_the_repetition_cap() -> None:
    values = {"t": [60.0, 140.0, 100.0, 70.0, 130.0], "max": [1.0, 900.0, 3.0, 2.0, 1.0]}
    full = projected_seconds(
        values, target=TARGET, n=5, n_max=1000, seconds_per_rep=2.0, extreme={"max"}
    )
    assert full == (_needed(values["t"]) - 5) * 2.0
    capped = projected_seconds(
        values, target=TARGET, n=5, n_max=20, seconds_per_rep=2.0, extreme={"max"}
    )
    assert capped == 30.0


def test_time_set_aside_for_cheaper_cells_makes_a_dearer_one_give_way() -> None:
    """The cell needs (needed - 5) x 1 s; that fits in the 200 s left beside 1 s for the
    cheaper cells but not beside 150 s."""
    values = [60.0, 140.0, 100.0, 70.0, 130.0]
    own = _needed(values) - len(values)
    assert 50 < own < 199
    kw: dict[str, object] = {
        "target": TARGET,
        "n_max": 1000,
        "elapsed": 100.0,
        "max_time": 300.0,
        "seconds_per_rep": 1.0,
    }
    alone = fixed_width_stop({"t": values}, reserved=1.0, **kw)  # type: ignore[arg-type]
    assert not alone.give_way
    crowded = fixed_width_stop({"t": values}, reserved=150.0, **kw)  # type: ignore[arg-type]
    assert (crowded.stop, crowded.reason, crowded.give_way) == (False, "continue", True)
