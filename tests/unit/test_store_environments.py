"""Schema 4: an environment may be a container and carries its VM variant as data; a
database of schema 3 (kinds native and vm only, no variant) is rebuilt once when opened,
keeping every environment, its id and its samples. Schema 5: an environment of any kind
(a plugin's, bench/envs/kinds.py); a database of schema 4 is rebuilt alike. The old
database is made here with schema 3's own CREATE TABLE, written out in the test (the
oracle: what hpcvm 3 wrote), and read back with sqlite3 directly as well as through the store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hpcvm.store import SCHEMA_VERSION, MetricRecord, NewEnvironment, NewSample, Store

SCHEMA_3_ENVIRONMENTS = """
CREATE TABLE environments (
    id            INTEGER PRIMARY KEY,
    run_id        INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name          TEXT    NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind IN ('native', 'vm')),
    profile       TEXT,
    plan_json     TEXT,
    accel         TEXT    NOT NULL,
    cpu_model     TEXT    NOT NULL DEFAULT '',
    versions_json TEXT    NOT NULL DEFAULT '{}',
    vcpus         INTEGER NOT NULL,
    memory_bytes  INTEGER NOT NULL,
    UNIQUE (run_id, name)
)"""

CONTAINER = NewEnvironment(
    name="container",
    kind="container",
    accel="native",
    versions={"container_runtime": "runc 1.1.5"},
    vcpus=1,
    memory_bytes=1,
)
VARIANT = NewEnvironment(
    name="vm:hpc+e1000+page=4K",
    kind="vm",
    profile="hpc",
    accel="tcg",
    vcpus=1,
    memory_bytes=1,
    variant={"nic": "e1000", "page": 4096},
)


def _sample(env: str) -> NewSample:
    return NewSample(
        env=env,
        suite="cmd",
        np=1,
        repetition=1,
        warmup=False,
        position=0,
        ok=True,
        started_at=1.0,
        metrics=(MetricRecord(metric="t", unit="s", higher_is_better=False, value=2.0),),
    )


def test_a_container_and_a_variant_round_trip(tmp_path: Path) -> None:
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(args={}, seed=1, confidence=0.9)
        for env in (CONTAINER, VARIANT):
            store.add_environment(run_id, env)
        got = {e.name: e for e in store.environments(run_id)}
    assert got["container"].kind == "container"
    assert got["container"].versions == {"container_runtime": "runc 1.1.5"}
    assert got["vm:hpc+e1000+page=4K"].variant == {"nic": "e1000", "page": 4096}
    raw = sqlite3.connect(tmp_path / "hpcvm.db")
    assert (
        raw.execute("SELECT variant_json FROM environments WHERE kind='container'").fetchone()[0]
        == "{}"
    )


def test_a_schema_3_database_is_widened_keeping_ids_and_samples(tmp_path: Path) -> None:
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(args={}, seed=1, confidence=0.9)
    db = tmp_path / "hpcvm.db"
    with sqlite3.connect(db) as con:  # what hpcvm with schema 3 wrote
        con.execute("DROP TABLE environments")
        con.execute(SCHEMA_3_ENVIRONMENTS)
        con.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
        con.execute(
            "INSERT INTO environments (id, run_id, name, kind, accel, vcpus, memory_bytes) "
            "VALUES (7, ?, 'vm:hpc', 'vm', 'kvm', 2, 3)",
            (run_id,),
        )
        con.execute(
            "INSERT INTO samples (run_id, env_id, suite, np, repetition, warmup, position, "
            "ok, started_at) VALUES (?, 7, 'cmd', 1, 1, 0, 0, 1, 1.0)",
            (run_id,),
        )
        with pytest.raises(sqlite3.IntegrityError):  # schema 3 refuses a container
            con.execute(
                "INSERT INTO environments (run_id, name, kind, accel, vcpus, memory_bytes) "
                "VALUES (?, 'container', 'container', 'native', 1, 1)",
                (run_id,),
            )
    with Store.open(tmp_path) as store:
        assert store.schema_version() == SCHEMA_VERSION == 5
        store.add_environment(run_id, CONTAINER)
        envs = {e.name: e for e in store.environments(run_id)}
        store.add_sample(run_id, _sample("container"))
        samples = store.samples(run_id)
    assert envs["vm:hpc"].id == 7 and envs["vm:hpc"].variant == {}
    assert envs["container"].kind == "container"
    assert sorted(s.env for s in samples) == ["container", "vm:hpc"]
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA foreign_keys = ON")
    assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
    assert (7,) in raw.execute("SELECT env_id FROM samples").fetchall()
    # the samples still cascade from their environment: the foreign key points at it
    raw.execute("DELETE FROM environments WHERE id = 7")
    assert raw.execute("SELECT COUNT(*) FROM samples WHERE env_id = 7").fetchone() == (0,)


SCHEMA_4_KIND = "kind          TEXT    NOT NULL CHECK (kind IN ('native', 'container', 'vm')),"
PLUGIN_KIND = NewEnvironment(name="noaslr", kind="noaslr", accel="native", vcpus=1, memory_bytes=1)


def test_a_schema_4_database_takes_a_plugin_kind_after_its_rebuild(tmp_path: Path) -> None:
    with Store.open(tmp_path, create=True) as store:
        run_id = store.create_run(args={}, seed=1, confidence=0.9)
        store.add_environment(run_id, VARIANT)
        store.add_sample(run_id, _sample(VARIANT.name))
    db = tmp_path / "hpcvm.db"
    with sqlite3.connect(db) as con:  # what hpcvm with schema 4 wrote: three kinds only
        definition = con.execute(
            "SELECT sql FROM sqlite_master WHERE name='environments'"
        ).fetchone()[0]
        assert "CHECK (kind <> '')" in definition
        old = definition.replace("CHECK (kind <> '')", SCHEMA_4_KIND.split("NULL ")[1][:-1])
        con.execute("PRAGMA legacy_alter_table = ON")  # the samples keep their reference
        con.execute("ALTER TABLE environments RENAME TO environments_5")
        con.execute(old.replace("IF NOT EXISTS ", ""))
        con.execute("INSERT INTO environments SELECT * FROM environments_5")
        con.execute("DROP TABLE environments_5")
        con.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
        with pytest.raises(sqlite3.IntegrityError):  # schema 4 refuses another kind
            con.execute(
                "INSERT INTO environments (run_id, name, kind, accel, vcpus, memory_bytes) "
                "VALUES (?, 'noaslr', 'noaslr', 'native', 1, 1)",
                (run_id,),
            )
    with Store.open(tmp_path) as store:
        assert store.schema_version() == 5
        store.add_environment(run_id, PLUGIN_KIND)
        envs = {e.name: e for e in store.environments(run_id)}
        assert [s.env for s in store.samples(run_id)] == [VARIANT.name]
    assert envs["noaslr"].kind == "noaslr" and envs[VARIANT.name].variant == VARIANT.variant
