"""Failure counting (bench/results/failures.py) and which summary rows exist, on synthetic
store records: the expected counts are written out by hand from the records below."""

from __future__ import annotations

from hpcvm.bench.results.failures import (
    cell_failures,
    failure_line,
    repeats_same_failure,
    without_valid_sample,
)
from hpcvm.bench.results.results import summarize_run
from hpcvm.store import MetricRecord, SampleRecord
from tests.unit.test_bench_runner_results import NATIVE, RUN, VM


def _sample(
    i: int,
    env: str,
    *,
    ok: bool,
    warmup: bool = False,
    error: str | None = None,
    metrics: dict[str, float | None] | None = None,
) -> SampleRecord:
    return SampleRecord(
        id=i,
        run_id=1,
        env=env,
        suite="noise",
        np=None,
        repetition=i,
        warmup=warmup,
        position=0,
        ok=ok,
        error=error,
        started_at=float(i),
        metrics=tuple(
            MetricRecord(metric=k, unit="us", higher_is_better=False, value=v, error=None)
            for k, v in (metrics or {}).items()
        ),
    )


def test_first_two_alike_failures_give_a_cell_up() -> None:
    same = [
        _sample(1, "native", ok=False, error="boom"),
        _sample(2, "native", ok=False, error="boom"),
    ]
    assert repeats_same_failure(same) == "boom"
    differ = [same[0], _sample(2, "native", ok=False, error="other")]
    assert repeats_same_failure(differ) is None
    recovered = [*same, _sample(3, "native", ok=True, metrics={"q": 1.0})]
    assert repeats_same_failure(recovered) is None
    assert repeats_same_failure(same[:1]) is None


def test_counts_reason_and_cells_without_valid_samples() -> None:
    samples = [
        _sample(1, "native", ok=True, warmup=True, metrics={"q": 1.0}),
        _sample(2, "native", ok=False, error="a"),
        _sample(3, "native", ok=True, metrics={"q": 1.0}),
        _sample(4, "native", ok=False, error="b"),
        _sample(5, "native", ok=False, error="a"),
        _sample(6, "vm:naive", ok=False, warmup=True, error="x"),
        _sample(7, "vm:naive", ok=False, error="x"),
    ]
    native, vm = cell_failures(samples)
    assert (native.samples, native.failed, native.valid) == (5, 3, 1)
    assert (native.reason, native.reason_count, native.given_up) == ("a", 2, False)
    assert (vm.samples, vm.failed, vm.valid, vm.given_up) == (2, 2, 0, True)
    assert without_valid_sample(samples) == [("vm:naive", "noise")]
    assert failure_line(native) == "native noise: 3 of 5 samples failed: a (2 of them)"
    assert "not repeated" in failure_line(vm)


def test_no_row_for_a_metric_an_environment_did_not_measure() -> None:
    """Natively the noise suite measured two CPUs, in the 1-vCPU VM one: the VM gets no
    row for cpu1, while a failed VM sample still leaves rows that say it failed."""
    two = {"q": 1.0, "q@cpu0": 1.0, "q@cpu1": 1.1}
    samples = [_sample(i, "native", ok=True, metrics=two) for i in range(1, 4)]
    samples += [_sample(i, "vm:naive", ok=True, metrics={"q": 2.0, "q@cpu0": 2.0}) for i in (4, 5)]
    samples.append(_sample(6, "vm:naive", ok=False, error="died", metrics={"q": None}))
    rows = summarize_run(RUN, [NATIVE, VM], samples)
    keys = {(r.env, r.metric): r for r in rows}
    assert ("vm:naive", "q@cpu1") not in keys
    assert ("native", "q@cpu1") in keys
    assert all(r.n > 0 or r.failed > 0 for r in rows)
    vm_q = keys[("vm:naive", "q")]
    assert (vm_q.n, vm_q.failed_samples, vm_q.failure_reason) == (2, 1, "died")


def test_an_interval_below_zero_is_flagged() -> None:
    spread = [1.0, 0.05, 0.05, 0.05]
    samples = [_sample(i, "native", ok=True, metrics={"q": v}) for i, v in enumerate(spread, 1)]
    (row,) = summarize_run(RUN, [NATIVE], samples)
    assert row.ci_low is not None and row.ci_low < 0
    assert "too noisy to trust" in row.interval_note
    assert any("too noisy" in w for w in row.warnings)
