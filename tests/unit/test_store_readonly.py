"""Results a user may read but not write: another user's world-readable directory, a
directory made read-only (0555), a database from an older hpcvm in either, a database
another writer has open now. Each is opened read-only and shows exactly what its owner
sees, and nothing of it changes: no journal files, no schema upgrade, no byte.

Root passes every permission check, so the reader here is a process that is not root:
a child forked from the test and switched with setuid(2) to the test user's uid (the
parent, root, plays the owner and the oracle: it reads the same database read-write).
The databases are made by the real store, in a directory under /var/tmp both can reach
(pytest's tmp_path is root's 0700).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from hpcvm.errors import BenchmarkError
from hpcvm.store import SCHEMA_VERSION, MetricRecord, NewEnvironment, NewSample, Store
from tests.cluster_support import TEST_UID
from tests.unit.test_store_environments import SCHEMA_3_ENVIRONMENTS
from tests.users import Raised, in_child_as

if os.geteuid() != 0:
    pytest.skip("switching to another user needs root", allow_module_level=True)


def as_other_user(work: Callable[[], Any], uid: int = TEST_UID, *, fails: bool = False) -> Any:
    """``work()`` in a forked child running as ``uid`` (not root); its result or, when
    it ``fails`` as expected, the hpcvm error it raised as (class name, exit code,
    message). Anything else fails the test with its text."""
    out = in_child_as(uid, uid, work)
    if not isinstance(out, Raised):
        assert not fails, f"expected an error, got {out!r}"
        return out
    assert fails and out.exit_code is not None, f"{out.name}: {out.message}"
    return (out.name, out.exit_code, out.message)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory under /var/tmp everyone may enter (0755, root's)."""
    path = Path(tempfile.mkdtemp(prefix="hpcvm-ro-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
        evidence={"interrupts": {"host": {"LOC": 10.0 * rep}}},
        metrics=(MetricRecord(metric="t", unit="s", higher_is_better=False, value=value),),
    )


def make_results(directory: Path, values: tuple[float, ...] = (2.0, 2.5, 3.0)) -> Path:
    """A finished run with two environments and samples, written by the real store."""
    with Store.open(directory, create=True) as store:
        run_id = store.create_run(args={"envs": ["native", "vm:hpc"]}, seed=3, confidence=0.97)
        for name, kind in (("native", "native"), ("vm:hpc", "vm")):
            env = NewEnvironment(name=name, kind=kind, accel="tcg", vcpus=1, memory_bytes=1)
            store.add_environment(run_id, env)
        for rep, value in enumerate(values, start=1):
            store.add_sample(run_id, _sample("native", rep, value))
            store.add_sample(run_id, _sample("vm:hpc", rep, value * 1.5))
        store.add_warning(run_id, "vm:hpc: planned on one node", env="vm:hpc")
        store.set_status(run_id, "finished", stop_reason="fixed")
    return directory


def read_all(directory: Path) -> tuple[bool, Any]:
    """Everything a report reads, as plain data (whether the store was read-only too)."""
    with Store.open(directory) as store:
        run = store.run()
        envs = store.environments(run.id)
        samples = store.samples(run.id)
        return store.readonly, (
            run.model_dump(),
            [e.model_dump() for e in envs],
            [s.model_dump() for s in samples],
            store.schema_version(),
        )


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file of the directory with its content's hash and mtime (nothing may change)."""
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_another_users_world_readable_results_read_as_their_owner_sees_them(
    shared: Path,
) -> None:
    results = make_results(shared / "r")
    before = snapshot(results)
    readonly, seen = as_other_user(lambda: read_all(results))
    writable, truth = read_all(results)  # root, the owner: read-write
    assert readonly and not writable
    assert seen == truth
    assert len(seen[2]) == 6 and seen[0]["warning_envs"] == {
        "vm:hpc: planned on one node": "vm:hpc"
    }
    assert snapshot(results) == before  # no -shm, no -wal, not a byte


def test_a_0555_directory_of_the_readers_own_is_read_without_journal_files(shared: Path) -> None:
    results = make_results(shared / "r")
    for path in (results, results / "hpcvm.db"):
        os.chown(path, TEST_UID, TEST_UID)
    results.chmod(0o555)  # the reader owns the database but cannot add files beside it
    before = snapshot(results)
    readonly, seen = as_other_user(lambda: read_all(results))
    assert readonly
    assert seen == read_all(results)[1]
    assert snapshot(results) == before


def test_a_live_writers_committed_samples_are_seen(shared: Path) -> None:
    results = make_results(shared / "r")
    with Store.open(results) as writer:  # the owner's bench, still running
        run_id = writer.create_run(args={}, seed=4, confidence=0.9)
        writer.add_environment(
            run_id,
            NewEnvironment(name="native", kind="native", accel="native", vcpus=1, memory_bytes=1),
        )
        writer.add_sample(run_id, _sample("native", 1, 7.0))
        assert Path(f"{results}/hpcvm.db-wal").exists()  # the sample is in the log only

        def latest() -> tuple[int, list[float | None]]:
            with Store.open(results) as store:
                run = store.run()
                return run.id, [m.value for s in store.samples(run.id) for m in s.metrics]

        assert as_other_user(latest) == (run_id, [7.0])


def test_an_older_database_is_upgraded_in_memory_only(shared: Path) -> None:
    results = make_results(shared / "r")
    db = results / "hpcvm.db"
    with sqlite3.connect(db) as con:  # what hpcvm with schema 3 wrote (no variant column)
        con.execute("PRAGMA foreign_keys = OFF")
        rows = con.execute(
            "SELECT id, run_id, name, kind, accel, vcpus, memory_bytes FROM environments"
        ).fetchall()
        con.execute("DROP TABLE environments")
        con.execute(SCHEMA_3_ENVIRONMENTS)
        con.executemany(
            "INSERT INTO environments (id, run_id, name, kind, accel, vcpus, memory_bytes) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        con.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    con.close()
    before = snapshot(results)
    readonly, seen = as_other_user(lambda: read_all(results))
    assert readonly and seen[3] == SCHEMA_VERSION
    assert [e["name"] for e in seen[1]] == ["native", "vm:hpc"]
    assert all(e["variant"] == {} for e in seen[1])
    assert len(seen[2]) == 6
    assert snapshot(results) == before  # still schema 3 on disk
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("3",)


def test_a_write_to_a_read_only_store_is_refused_in_one_line(shared: Path) -> None:
    results = make_results(shared / "r")

    def write() -> None:
        with Store.open(results) as store:
            store.create_run(args={}, seed=1, confidence=0.9)

    name, code, message = as_other_user(write, fails=True)
    assert (name, code) == ("BenchmarkError", BenchmarkError.exit_code)
    assert message.startswith(f"{results / 'hpcvm.db'} is read-only for this user")
    assert "\n" not in message


def test_a_database_the_reader_may_not_read_names_its_owner(shared: Path) -> None:
    results = make_results(shared / "r")
    (results / "hpcvm.db").chmod(0o600)
    name, code, message = as_other_user(lambda: read_all(results), fails=True)
    assert (name, code) == ("BenchmarkError", 7)
    assert "cannot be read by this user (owner root, mode 0600)" in message
    assert "chmod a+r" in message and "\n" not in message


def test_a_directory_the_reader_may_not_enter_is_named(shared: Path) -> None:
    private = shared / "private"
    private.mkdir(mode=0o700)
    results = make_results(private / "r")
    name, code, message = as_other_user(lambda: read_all(results), fails=True)
    assert (name, code) == ("BenchmarkError", 7)
    assert f"{private} may not be entered" in message and "\n" not in message
