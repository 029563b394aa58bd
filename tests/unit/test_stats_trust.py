"""The trust verdict on the mean's interval: each kind on data built to show it."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from hpcvm.errors import UsageError
from hpcvm.stats import (
    flag_outliers,
    overhead,
    overhead_trust,
    robust_overhead,
    sample_trust,
)


def _normal(mean: float, n: int, seed: int) -> list[float]:
    return list(np.random.default_rng(seed).normal(mean, mean * 0.03, n))


def test_clean_samples_are_trusted() -> None:
    nat, vm = _normal(100, 20, 1), _normal(110, 20, 2)
    assert not any(flag_outliers(nat)) and not any(flag_outliers(vm))
    t = overhead_trust(nat, vm, overhead(nat, vm, higher_is_better=False))
    assert t.trusted and t.kinds == () and t.sentence == ""


def test_an_outlier_in_the_vm_is_reported_with_its_subject() -> None:
    nat, vm = _normal(100, 20, 1), _normal(110, 20, 2)
    vm[5] *= 2.0
    t = overhead_trust(nat, vm, overhead(nat, vm, higher_is_better=False))
    assert not t.trusted
    assert t.kinds == ("outliers",)
    assert t.issues[0].subject == "VM"
    assert t.sentence.startswith("the mean's interval should not be trusted: 1 of 20 VM runs")
    named = overhead_trust(nat, vm, overhead(nat, vm, higher_is_better=False), subject="container")
    assert named.issues[0].subject == "container"
    assert "1 of 20 container runs" in named.sentence


def test_skewed_runs_are_reported() -> None:
    values = list(np.random.default_rng(9).lognormal(0.0, 1.0, 60))
    bulk = np.asarray(values)[~np.asarray(flag_outliers(values))]
    assert sps.skewtest(bulk).pvalue < 0.01  # the oracle agrees it is skewed
    t = sample_trust(values, subject="native")
    assert "skewed" in t.kinds
    assert all(i.subject == "native" for i in t.issues)


def test_symmetric_runs_are_not_called_skewed() -> None:
    values = list(np.random.default_rng(10).uniform(90, 110, 60))
    assert sps.skewtest(values).pvalue > 0.01
    assert "skewed" not in sample_trust(values).kinds


def test_few_runs_cannot_be_checked() -> None:
    t = sample_trust([1.0, 1.1, 0.9])
    assert t.kinds == ("few-runs",)
    assert "only 3 runs" in t.sentence
    assert "no interval" in sample_trust([1.0]).sentence


def test_unbounded_fieller_is_a_reason() -> None:
    nat = [0.1, 5.0, 0.2, 6.0, 0.1, 4.0]  # mean barely distinguishable from zero
    vm = _normal(3, 6, 4)
    o = overhead(nat, vm, higher_is_better=False)
    assert not o.bounded
    assert "unbounded" in overhead_trust(nat, vm, o).kinds


def test_bootstrap_from_few_runs_is_a_reason() -> None:
    nat, vm = _normal(100, 8, 1), _normal(110, 8, 2)
    o = overhead(nat, vm, higher_is_better=False, method="bootstrap", n_resamples=500)
    assert overhead_trust(nat, vm, o).kinds == ("bootstrap-few-runs",)


def test_wrong_use_is_refused() -> None:
    nat, vm = _normal(100, 8, 1), _normal(110, 8, 2)
    with pytest.raises(UsageError, match="mean's overhead"):
        overhead_trust(nat, vm, robust_overhead(nat, vm, higher_is_better=False))
    with pytest.raises(UsageError, match="samples it came from"):
        overhead_trust(nat, vm[:5], overhead(nat, vm, higher_is_better=False))
