"""The bench table marks extreme statistics from the suites' own metric definitions
(the registry's Metric.extreme), never from a list of names kept in the view."""

from __future__ import annotations

import pytest

from hpcvm.bench.suites.noise.suite import METRICS as NOISE_METRICS
from hpcvm.bench.suites.registry import REGISTRY
from hpcvm.cli.bench_view import is_extreme


@pytest.mark.parametrize("metric", [m.name for m in NOISE_METRICS])
def test_noise_metrics_and_their_per_cpu_details(metric: str) -> None:
    (defined,) = [m for m in REGISTRY["noise"].metrics if m.name == metric]
    assert is_extreme("noise", metric) is defined.extreme
    assert is_extreme("noise", f"{metric}@cpu3") is defined.extreme


def test_no_hpcc_metric_is_extreme_and_unknown_suites_are_not() -> None:
    assert not any(is_extreme("hpcc", m.name) for m in REGISTRY["hpcc"].metrics)
    assert not is_extreme("gone", "NoiseMaxDetour_usec")
    assert sum(is_extreme("noise", m.name) for m in NOISE_METRICS) == 2
