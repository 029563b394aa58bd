"""Outlying samples are kept, marked in the database, counted in the summary, and the
robust overhead stands beside the mean's. The expected robust estimate is recomputed
here by brute force with numpy (the median of every VM/native run ratio)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from hpcvm.bench.results.results import outlier_marks, summarize_run
from hpcvm.store import SCHEMA_VERSION, MetricRecord, SampleRecord, Store
from tests.unit.test_bench_runner_results import NATIVE, RUN, VM


def _samples(env: str, values: list[float], first_id: int) -> list[SampleRecord]:
    return [
        SampleRecord(
            id=first_id + i,
            run_id=1,
            env=env,
            suite="cmd",
            np=1,
            repetition=i,
            warmup=False,
            position=0,
            ok=True,
            started_at=float(i),
            metrics=(MetricRecord(metric="t", unit="s", higher_is_better=False, value=v),),
        )
        for i, v in enumerate(values)
    ]


RNG = np.random.default_rng(7)
NATIVE_T = list(RNG.normal(10.0, 0.1, 20))
VM_T = [*RNG.normal(11.0, 0.11, 19), 22.0]  # one VM run twice as slow


def test_one_wild_run_is_marked_counted_and_distrusted() -> None:
    samples = _samples("native", NATIVE_T, 1) + _samples("vm:naive", VM_T, 100)
    assert outlier_marks(samples) == [(119, "t")]
    rows = {r.env: r for r in summarize_run(RUN, [NATIVE, VM], samples)}
    vm = rows["vm:naive"]
    assert (vm.outliers, rows["native"].outliers) == (1, 0)
    assert "outliers" in vm.trust_kinds and vm.trust_note
    ratios = np.array(VM_T)[:, None] / np.array(NATIVE_T)[None, :]
    assert vm.robust_pct is not None
    assert abs(vm.robust_pct - (np.median(ratios) - 1) * 100) < 1e-6
    assert vm.robust_ci_low is not None and vm.robust_ci_high is not None
    assert vm.robust_ci_low < vm.robust_pct < vm.robust_ci_high


def test_marks_round_trip_and_an_old_database_gains_the_table(tmp_path: Path) -> None:
    db = tmp_path / "hpcvm.db"
    with sqlite3.connect(db) as con:  # what schema version 1 had: no flags table
        con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    with Store.open(tmp_path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        run_id = store.create_run(args={}, seed=1, confidence=0.97)
        assert store.outliers(run_id) == set()
        store.set_outliers(run_id, [])
    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    assert "flags" in tables
