"""Summaries from store records: means, overhead against native, nulls where nothing can
be claimed, warnings. Expected figures are computed here with numpy, independently."""

from __future__ import annotations

import numpy as np
import pytest

from hpcvm.bench.results.results import summarize_run
from hpcvm.bench.run.session import TCG_WARNING
from hpcvm.store import EnvironmentRecord, MetricRecord, RunRecord, SampleRecord

RUN = RunRecord(
    id=1,
    args={},
    host=None,
    seed=1,
    confidence=0.97,
    started_at=0.0,
    finished_at=1.0,
    elapsed_s=1.0,
    status="finished",
    stop_reason="fixed",
    stop_detail=None,
    error=None,
    warnings=(TCG_WARNING, "vm:naive: only for the naive VM"),
    warning_envs={"vm:naive: only for the naive VM": "vm:naive"},
    hpcvm_version="0",
)
NATIVE = EnvironmentRecord(
    id=1, run_id=1, name="native", kind="native", accel="native", vcpus=2, memory_bytes=1
)
VM = EnvironmentRecord(
    id=2,
    run_id=1,
    name="vm:naive",
    kind="vm",
    accel="tcg",
    cpu_model="qemu64",
    vcpus=2,
    memory_bytes=1,
)


def _samples(
    env: str, values: dict[str, list[float | None]], higher: bool = False
) -> list[SampleRecord]:
    n = len(next(iter(values.values())))
    out = []
    for i in range(n):
        metrics = tuple(
            MetricRecord(
                metric=name,
                unit="s",
                higher_is_better=higher,
                value=series[i],
                error=None if series[i] is not None else "missing",
            )
            for name, series in values.items()
        )
        out.append(
            SampleRecord(
                id=len(out) + (100 if env != "native" else 0),
                run_id=1,
                env=env,
                suite="cmd",
                np=2,
                repetition=i,
                warmup=False,
                position=0,
                ok=True,
                started_at=float(i),
                evidence={"interrupts_total": {"host": 100.0 * (i + 1), "guest": 7.0}},
                metrics=metrics,
            )
        )
    return out


@pytest.mark.parametrize("higher", [False, True])
def test_overhead_is_the_ratio_of_means_signed_so_positive_is_worse(higher: bool) -> None:
    native = [10.0, 10.2, 9.9, 10.1]
    vm = [12.0, 12.3, 11.8, 12.1]
    samples = _samples("native", {"t": list(native)}, higher) + _samples(
        "vm:naive", {"t": list(vm)}, higher
    )
    rows = {r.env: r for r in summarize_run(RUN, [NATIVE, VM], samples)}

    nat, v = np.mean(native), np.mean(vm)
    ratio = nat / v if higher else v / nat
    row = rows["vm:naive"]
    assert row.overhead_pct == pytest.approx((ratio - 1) * 100)
    assert row.overhead_ci_low is not None and row.overhead_ci_high is not None
    assert row.overhead_ci_low < row.overhead_pct < row.overhead_ci_high
    assert row.significant is True  # 20% apart with tiny spread
    assert row.mean == pytest.approx(v) and row.n == 4
    assert row.interrupts_per_s == 7.0  # the guest's own rate for a VM
    assert rows["native"].interrupts_per_s == pytest.approx(250.0)  # host's, mean of 100..400
    assert rows["native"].overhead_pct is None and rows["native"].significant is None


def test_no_claim_without_a_bounded_interval() -> None:
    # Native values straddle zero: the ratio's denominator is not clearly non-zero.
    native = [0.5, -0.4, 0.45, -0.5]
    vm = [1.0, 1.1, 0.9, 1.0]
    samples = _samples("native", {"t": list(native)}) + _samples("vm:naive", {"t": list(vm)})
    row = next(r for r in summarize_run(RUN, [NATIVE, VM], samples) if r.env == "vm:naive")
    assert row.overhead_pct is None
    assert row.overhead_ci_low is None and row.overhead_ci_high is None
    assert row.significant is False
    assert "unbounded" in row.overhead_note


def test_a_metric_missing_everywhere_in_a_vm_still_has_a_row() -> None:
    samples = _samples("native", {"t": [1.0, 1.1, 1.2], "u": [5.0, 5.0, 5.1]}) + _samples(
        "vm:naive", {"t": [1.5, 1.6, 1.4], "u": [None, None, None]}
    )
    rows = {(r.env, r.metric): r for r in summarize_run(RUN, [NATIVE, VM], samples)}
    assert set(rows) == {(e, m) for e in ("native", "vm:naive") for m in ("t", "u")}
    lost = rows[("vm:naive", "u")]
    assert (lost.n, lost.failed, lost.mean, lost.overhead_pct) == (0, 3, None, None)
    assert any("failed" in w for w in lost.warnings)


def test_every_row_of_a_tcg_run_carries_the_warning_and_env_warnings_stay_with_their_env() -> None:
    samples = _samples("native", {"t": [1.0, 1.1, 1.2]}) + _samples(
        "vm:naive", {"t": [2.0, 2.1, 2.2]}
    )
    rows = {r.env: r for r in summarize_run(RUN, [NATIVE, VM], samples)}
    for row in rows.values():
        assert any(w.startswith("TCG") for w in row.warnings)
    assert "vm:naive: only for the naive VM" in rows["vm:naive"].warnings
    assert "vm:naive: only for the naive VM" not in rows["native"].warnings
