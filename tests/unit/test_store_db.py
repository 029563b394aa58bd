"""The results database: schema and version, writing and reading samples, resume keys."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.store import (
    SCHEMA_VERSION,
    MetricRecord,
    NewEnvironment,
    NewSample,
    SampleKey,
    Store,
)

NATIVE = NewEnvironment(name="native", kind="native", accel="native", vcpus=2, memory_bytes=1 << 30)
VM = NewEnvironment(
    name="vm:naive",
    kind="vm",
    profile="naive",
    plan={"profile": "naive", "vcpus": 2},
    accel="tcg",
    cpu_model="qemu64",
    versions={"qemu": "7.2"},
    vcpus=2,
    memory_bytes=1 << 29,
)


def _sample(env: str, rep: int, value: float | None, *, warmup: bool = False) -> NewSample:
    metric = MetricRecord(
        metric="Time",
        unit="s",
        higher_is_better=False,
        value=value,
        error=None if value is not None else "missing",
    )
    return NewSample(
        env=env,
        suite="cmd",
        np=None,
        repetition=rep,
        warmup=warmup,
        position=0,
        ok=value is not None,
        error=None if value is not None else "exited 1",
        log_path=f"/logs/{env}-{rep}.log",
        started_at=1.0 + rep,
        host_seconds=2.5,
        guest_seconds=2.4 if env != "native" else None,
        evidence={"interrupts": {"host": {"LOC": 100.0}}},
        metrics=(metric,),
    )


def test_new_database_records_its_schema_version(tmp_path: Path) -> None:
    with Store.open(tmp_path / "out", create=True) as store:
        assert store.schema_version() == SCHEMA_VERSION
    raw = sqlite3.connect(tmp_path / "out" / "hpcvm.db")
    assert raw.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"meta", "runs", "environments", "samples", "metric_values"} <= tables


def test_missing_database_is_refused_unless_created(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no results database"):
        Store.open(tmp_path)
    assert not (tmp_path / "hpcvm.db").exists()


def test_newer_schema_and_foreign_files_are_refused(tmp_path: Path) -> None:
    with Store.open(tmp_path, create=True):
        pass
    raw = sqlite3.connect(tmp_path / "hpcvm.db")
    raw.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    raw.commit()
    raw.close()
    with pytest.raises(BenchmarkError, match="newer"):
        Store.open(tmp_path)

    other = tmp_path / "other.db"
    raw = sqlite3.connect(other)
    raw.execute("CREATE TABLE t (x)")
    raw.commit()
    raw.close()
    with pytest.raises(BenchmarkError, match="not an hpcvm results database"):
        Store.open(other)

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(BenchmarkError, match="not a readable"):
        Store.open(junk)


def test_samples_round_trip_with_metrics_and_evidence(tmp_path: Path) -> None:
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(args={"env": ["native"]}, seed=7, confidence=0.97)
        store.add_environment(run_id, NATIVE)
        store.add_environment(run_id, VM)
        written = [
            _sample("native", 0, 1.0, warmup=True),
            _sample("native", 0, 1.5),
            _sample("vm:naive", 0, None),
            _sample("vm:naive", 1, 3.25),
        ]
        for s in written:
            store.add_sample(run_id, s)

    with Store.open(tmp_path) as store:
        (run,) = store.runs()
        assert (run.seed, run.confidence, run.status, run.args) == (
            7,
            0.97,
            "abandoned",  # recorded as running, but no writer holds the directory's lock
            {"env": ["native"]},
        )
        read = store.samples(run.id)
        assert [s.model_dump(exclude={"id", "run_id"}) for s in read] == [
            s.model_dump() for s in written
        ]
        measured = store.samples(run.id, include_warmup=False)
        assert [s.warmup for s in measured] == [False, False, False]
        envs = store.environments(run.id)
        assert [e.name for e in envs] == ["native", "vm:naive"]
        assert envs[1].plan == {"profile": "naive", "vcpus": 2}
        assert envs[1].versions == {"qemu": "7.2"}


def test_completed_keys_are_what_resume_skips(tmp_path: Path) -> None:
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(args={}, seed=1, confidence=0.97)
        store.add_environment(run_id, NATIVE)
        store.add_sample(run_id, _sample("native", 0, 1.0, warmup=True))
        store.add_sample(run_id, _sample("native", 0, None))  # failed counts as done
        assert store.completed(run_id) == {
            SampleKey(env="native", suite="cmd", np=None, repetition=0, warmup=True),
            SampleKey(env="native", suite="cmd", np=None, repetition=0, warmup=False),
        }
        with pytest.raises(sqlite3.IntegrityError):
            store.add_sample(run_id, _sample("native", 0, 2.0))  # the same key twice


def test_environment_is_recorded_once_per_run(tmp_path: Path) -> None:
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(args={}, seed=1, confidence=0.97)
        first = store.add_environment(run_id, VM)
        again = store.add_environment(run_id, VM.model_copy(update={"cpu_model": "other"}))
        assert again == first
        assert again.cpu_model == "qemu64"


def test_status_warnings_and_elapsed(tmp_path: Path) -> None:
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(args={}, seed=1, confidence=0.9, warnings=["w1"])
        store.add_warning(run_id, "w2")
        store.add_warning(run_id, "w1")
        store.add_elapsed(run_id, 2.0)
        store.add_elapsed(run_id, 3.5)
        store.set_status(run_id, "interrupted")
        run = store.run()
        assert run.warnings == ("w1", "w2")
        assert run.elapsed_s == 5.5
        assert run.status == "interrupted" and run.finished_at is not None
        store.set_status(run_id, "running")
        assert store.run(run_id).finished_at is None
        store.set_status(run_id, "finished", stop_reason="target")
        assert store.run(run_id).stop_reason == "target"
        with pytest.raises(BenchmarkError, match="no run 99"):
            store.run(99)


def test_a_committed_sample_survives_the_writer_being_killed(tmp_path: Path) -> None:
    """A process that writes one sample and is then killed (no close, no cleanup)
    leaves that sample readable: each sample is its own committed transaction."""
    script = f"""
import os, signal
from pathlib import Path
from hpcvm.store import Store, NewEnvironment, NewSample
store = Store.open(Path({str(tmp_path)!r}), create=True)
run = store.create_run(args={{}}, seed=3, confidence=0.97)
store.add_environment(run, NewEnvironment(name="native", kind="native", accel="native",
                                          vcpus=1, memory_bytes=1))
store.add_sample(run, NewSample(env="native", suite="s", np=1, repetition=0, warmup=False,
                                position=0, ok=True, started_at=0.0))
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -9
    with Store.open(tmp_path) as store:
        (sample,) = store.samples(store.run().id)
        assert (sample.suite, sample.np, sample.ok) == ("s", 1, True)


def test_a_running_run_is_in_progress_only_while_its_writer_holds_the_lock(
    tmp_path: Path,
) -> None:
    from hpcvm.lock import exclusive
    from hpcvm.store import writer_lock_path

    with exclusive(writer_lock_path(tmp_path), "results", "wait") as me:
        with Store.open(tmp_path, create=True) as store:
            store.create_run(args={}, seed=1, confidence=0.97)
        with Store.open(tmp_path) as store:
            run = store.run()
        assert (run.status, run.writer) == ("running", me.describe())
        assert run.status_text.startswith(f"running (in progress: pid {me.pid}")
    with Store.open(tmp_path) as store:
        run = store.run()
    assert (run.status, run.writer) == ("abandoned", None)
    assert "--resume" in run.status_text
