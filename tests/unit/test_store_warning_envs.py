"""Which environment a run warning is about is stored as data, read back with the run,
and decides which result rows carry the warning; a database of schema 2 (owners only in
the wording) gains the owners once when opened. The expected owners are the ones each
test writes, never recovered from the text by the test."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hpcvm.bench.results.results import summarize_run
from hpcvm.store import (
    SCHEMA_VERSION,
    MetricRecord,
    NewEnvironment,
    NewSample,
    Store,
)

NATIVE = NewEnvironment(name="native", kind="native", accel="native", vcpus=1, memory_bytes=1)
VM = NewEnvironment(name="vm:hpc", kind="vm", profile="hpc", accel="kvm", vcpus=1, memory_bytes=1)


def _sample(env: str, rep: int, value: float) -> NewSample:
    return NewSample(
        env=env,
        suite="cmd",
        np=1,
        repetition=rep,
        warmup=False,
        position=0,
        ok=True,
        started_at=float(rep),
        metrics=(MetricRecord(metric="t", unit="s", higher_is_better=False, value=value),),
    )


def test_owners_round_trip_and_are_kept_once(tmp_path: Path) -> None:
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(
            args={},
            seed=1,
            confidence=0.9,
            warnings=["about vm", "about the run"],
            warning_envs={"about vm": "vm:hpc", "never warned": "native"},
        )
        store.add_warning(run_id, "closing failed", env="native")
        store.add_warning(run_id, "closing failed", env="native")  # a resumed run repeats
        store.add_warning(run_id, "resolution coarse")
        run = store.run(run_id)
        assert run.warnings == ("about vm", "about the run", "closing failed", "resolution coarse")
        assert run.warning_envs == {"about vm": "vm:hpc", "closing failed": "native"}
        assert [r.warning_envs for r in store.runs()] == [run.warning_envs]


def test_a_warning_goes_to_the_rows_of_its_environment_only(tmp_path: Path) -> None:
    """The wording deliberately names another environment: only the data decides."""
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(args={}, seed=1, confidence=0.9)
        for env in (NATIVE, VM):
            store.add_environment(run_id, env)
            for rep in range(3):
                store.add_sample(run_id, _sample(env.name, rep, 1.0 + rep / 10))
        store.add_warning(run_id, "native: said of vm:hpc", env="vm:hpc")
        store.add_warning(run_id, "vm:hpc: about the whole run")
        store.set_status(run_id, "finished", stop_reason="fixed")
        run = store.run(run_id)
        rows = summarize_run(run, store.environments(run_id), store.samples(run_id))
    by_env = {r.env: r.warnings for r in rows}  # the run's warnings first, then the row's
    assert by_env["vm:hpc"][:2] == ("native: said of vm:hpc", "vm:hpc: about the whole run")
    assert by_env["native"][0] == "vm:hpc: about the whole run"
    assert "native: said of vm:hpc" not in by_env["native"]


def _make_version_2(db: Path) -> None:
    """Schema 2 is schema 3 without the warning_envs table."""
    with sqlite3.connect(db) as con:
        con.execute("DROP TABLE warning_envs")
        con.execute("UPDATE meta SET value='2' WHERE key='schema_version'")


def test_a_version_2_database_gains_the_owners_its_wording_gave(tmp_path: Path) -> None:
    warnings = [
        "vm:hpc: planned with housekeeping 0",
        "native: closing it failed: busy",
        "vm:numa: planned, but the run failed before it started",
        "the host's tuning changed since the run started",
        "vm:pinned: an environment this run never had",
    ]
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(
            args={"config": {"envs": ["native", "vm:hpc", "vm:numa"]}},
            seed=1,
            confidence=0.9,
            warnings=warnings,
        )
        store.add_environment(run_id, NATIVE)
        store.add_environment(run_id, VM)
    _make_version_2(tmp_path / "hpcvm.db")
    with Store.open(tmp_path) as store:
        assert store.schema_version() == SCHEMA_VERSION == 5
        run = store.run(run_id)
    assert run.warnings == tuple(warnings)
    assert run.warning_envs == {
        warnings[0]: "vm:hpc",
        warnings[1]: "native",
        warnings[2]: "vm:numa",
    }
    with Store.open(tmp_path) as store:  # opened again: nothing more to adopt
        assert store.run(run_id).warning_envs == run.warning_envs
