"""The results database: open or create it, write samples one by one, read them back.

``Store.open(path)`` accepts the results directory or the ``.db`` file. Writes commit at
once (WAL journal, ``synchronous=FULL``): a sample written is on disk before the next
run starts, so Ctrl-C, a crash or a power cut loses at most the sample in flight.

Results are shared: a user reads a colleague's world-readable directory, or one made
read-only (``chmod 0555``) to keep it as it is. A process that cannot write the
database or its directory opens it read-only (SQLite URI ``mode=ro``) and writes
nothing: not the WAL mode, not a schema upgrade (an older database is upgraded in a
copy in memory, so what it shows is still right). A WAL reader needs the ``-shm`` file
beside the database; where the directory cannot be written and none exists, no writer
has the database open, so it is opened ``immutable`` (no locks, no shm); where one
exists a writer may be live, and the reader uses it read-only, seeing the writer's
committed samples.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from hpcvm import __version__
from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.lock import is_held, read_holder
from hpcvm.store.migrate import (
    WARNING_ENVS_SINCE,
    WIDE_ENVIRONMENTS_SINCE,
    adopt_warning_envs,
    rebuild_environments,
)
from hpcvm.store.records import (
    EnvironmentRecord,
    MetricRecord,
    NewEnvironment,
    NewSample,
    RunRecord,
    RunStatus,
    SampleKey,
    SampleRecord,
)
from hpcvm.store.schema import ENVIRONMENTS, ENVIRONMENTS_TABLE, SCHEMA_VERSION, TABLES

DB_NAME = "hpcvm.db"
WRITER_LOCK = "hpcvm.lock"  # held by the one process writing the directory (hpcvm.lock)
NO_NP = 0  # the np column's value for suites that ignore the process count


def db_path(path: Path) -> Path:
    """The database file for a results directory or a path to the file itself."""
    return path / DB_NAME if path.is_dir() or path.suffix != ".db" else path


def writer_lock_path(results_dir: Path) -> Path:
    """The lock file the one writer of a results directory holds."""
    return results_dir / WRITER_LOCK


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Store:
    """A connection to one results database (not thread-safe; one writer at a time)."""

    def __init__(
        self, connection: sqlite3.Connection, path: Path, *, readonly: bool = False
    ) -> None:
        self._db = connection
        self.path = path
        self.readonly = readonly  # opened read-only: every write is refused (module doc)

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, *, create: bool = False) -> Store:
        """Open the database of a results directory (or a ``.db`` file).

        ``create``: make the directory and an empty database if missing. Otherwise a
        missing database is a UsageError naming the directory (the user named a
        directory that holds no results: exit 2, as README's exit-code table says). A
        database from a newer hpcvm (higher schema version) or a file that is not one is
        refused; one this process may not read is a BenchmarkError (exit 7) naming who
        can make it readable. Without ``create``, a database this process cannot write
        (another user's, a read-only directory) is opened read-only (module doc).
        """
        file = _existing_db(Path(path), create=create)
        readonly = not create and not _can_write(file)
        try:
            connection = _connect_readonly(file) if readonly else _connect(file)
        except sqlite3.DatabaseError as exc:
            raise (_journal_unreadable(file, exc) if readonly else _unreadable(file, exc)) from exc
        try:
            store = cls(connection, file, readonly=readonly)
            store._ensure_schema()
        except sqlite3.DatabaseError as exc:
            connection.close()
            raise _unreadable(file, exc) from exc
        except BaseException:
            connection.close()
            raise
        return store

    def _ensure_schema(self) -> None:
        tables = {
            r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if tables and "meta" not in tables:
            raise BenchmarkError(f"{self.path} is an SQLite file but not an hpcvm results database")
        found = 0
        if "meta" in tables:
            found = self.schema_version()
            if found > SCHEMA_VERSION:
                raise BenchmarkError(
                    f"{self.path} has schema version {found}, newer than this hpcvm's "
                    f"{SCHEMA_VERSION}: upgrade hpcvm to read it"
                )
            if found == SCHEMA_VERSION:
                return  # nothing to write: a reader never waits on a running writer
        if not self.readonly:
            self._upgrade(found)
            return
        self._db = _in_memory(self._db)  # upgraded in a copy: the file stays as it is
        self.readonly = False
        try:
            self._upgrade(found)
        finally:
            self.readonly = True  # the copy is not the file: a write is still refused

    def _upgrade(self, found: int) -> None:
        """Bring a database of version ``found`` (0: a new file) to this version."""
        # executescript commits on its own; IF NOT EXISTS makes it a no-op on a database
        # of this version.
        self._db.executescript(TABLES)
        if 0 < found < WIDE_ENVIRONMENTS_SINCE:
            rebuild_environments(self._db, ENVIRONMENTS, ENVIRONMENTS_TABLE)
        with self._transaction():
            # a database of an older version has just gained the newer tables
            if 0 < found < WARNING_ENVS_SINCE:
                adopt_warning_envs(self._db)
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value=excluded.value",
                (str(SCHEMA_VERSION),),
            )
            self._db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('created_by', ?)",
                (f"hpcvm {__version__}",),
            )

    def schema_version(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        if self.readonly:
            raise BenchmarkError(
                f"{self.path} is read-only for this user: write results into a directory "
                "of your own (--out DIR)"
            )
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- runs ---------------------------------------------------------------------------

    def create_run(
        self,
        *,
        args: dict[str, Any],
        seed: int,
        confidence: float,
        host: dict[str, Any] | None = None,
        warnings: Sequence[str] = (),
        warning_envs: Mapping[str, str] | None = None,
    ) -> int:
        """A new run in state ``running``; its id. ``warning_envs``: the environment
        each of ``warnings`` is about, by its text (see ``add_warning``)."""
        with self._transaction():
            cur = self._db.execute(
                "INSERT INTO runs (args_json, host_json, seed, confidence, started_at, status, "
                "warnings_json, hpcvm_version) VALUES (?, ?, ?, ?, ?, 'running', ?, ?)",
                (
                    _dumps(args),
                    None if host is None else _dumps(host),
                    seed,
                    confidence,
                    time.time(),
                    _dumps(list(warnings)),
                    __version__,
                ),
            )
            assert cur.lastrowid is not None
            for text, env in (warning_envs or {}).items():
                if text in warnings:
                    self._own_warning(cur.lastrowid, text, env)
        return cur.lastrowid

    def runs(self) -> list[RunRecord]:
        """Every run, oldest first."""
        rows = self._db.execute("SELECT * FROM runs ORDER BY id").fetchall()
        return [self._live(_run(r, self._warning_envs(r["id"]))) for r in rows]

    def run(self, run_id: int | None = None) -> RunRecord:
        """One run; the latest when ``run_id`` is None. BenchmarkError if there is none."""
        if run_id is None:
            row = self._db.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        else:
            row = self._db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            which = "no run" if run_id is None else f"no run {run_id}"
            raise BenchmarkError(f"{self.path} holds {which}")
        return self._live(_run(row, self._warning_envs(row["id"])))

    def _warning_envs(self, run_id: int) -> dict[str, str]:
        rows = self._db.execute("SELECT text, env FROM warning_envs WHERE run_id=?", (run_id,))
        return {text: env for text, env in rows}

    def _live(self, run: RunRecord) -> RunRecord:
        """A run recorded as running is in progress only while a writer holds the
        directory's lock; otherwise its writer died and it reads back as abandoned."""
        if run.status != "running":
            return run
        lock = writer_lock_path(self.path.parent)
        if not is_held(lock):
            return run.model_copy(update={"status": "abandoned"})
        holder = read_holder(lock)
        return run.model_copy(update={"writer": holder.describe() if holder else "a live process"})

    def set_status(
        self,
        run_id: int,
        status: RunStatus,
        *,
        stop_reason: str | None = None,
        stop_detail: str | None = None,
        error: str | None = None,
    ) -> None:
        """Mark a run running again (resume) or ended (finished, interrupted, failed)."""
        finished = None if status == "running" else time.time()
        with self._transaction():
            self._db.execute(
                "UPDATE runs SET status=?, finished_at=?, stop_reason=COALESCE(?, stop_reason), "
                "stop_detail=COALESCE(?, stop_detail), error=? WHERE id=?",
                (status, finished, stop_reason, stop_detail, error, run_id),
            )

    def add_elapsed(self, run_id: int, seconds: float) -> None:
        with self._transaction():
            self._db.execute(
                "UPDATE runs SET elapsed_s = elapsed_s + ? WHERE id=?", (seconds, run_id)
            )

    def add_warning(self, run_id: int, text: str, *, env: str | None = None) -> None:
        """Append a warning to the run (kept once: a resumed run may repeat it).

        ``env``: the environment it is about ("vm:hpc"), as data, so that a reader
        (a result row of that environment) never has to find it in the text; None for a
        warning about the whole run."""
        with self._transaction():
            if env is not None:
                self._own_warning(run_id, text, env)
            row = self._db.execute(
                "SELECT warnings_json FROM runs WHERE id=?", (run_id,)
            ).fetchone()
            warnings: list[str] = json.loads(row[0])
            if text not in warnings:
                warnings.append(text)
                self._db.execute(
                    "UPDATE runs SET warnings_json=? WHERE id=?", (_dumps(warnings), run_id)
                )

    def _own_warning(self, run_id: int, text: str, env: str) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO warning_envs (run_id, text, env) VALUES (?, ?, ?)",
            (run_id, text, env),
        )

    # -- environments -------------------------------------------------------------------

    def add_environment(self, run_id: int, env: NewEnvironment) -> EnvironmentRecord:
        """Record an environment of a run; if it is recorded already (a resumed run),
        keep the first description and return it."""
        with self._transaction():
            self._db.execute(
                "INSERT OR IGNORE INTO environments (run_id, name, kind, profile, plan_json, "
                "accel, cpu_model, versions_json, vcpus, memory_bytes, variant_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    env.name,
                    env.kind,
                    env.profile,
                    None if env.plan is None else _dumps(env.plan),
                    env.accel,
                    env.cpu_model,
                    _dumps(env.versions),
                    env.vcpus,
                    env.memory_bytes,
                    _dumps(env.variant),
                ),
            )
        return self.environment(run_id, env.name)

    def environment(self, run_id: int, name: str) -> EnvironmentRecord:
        row = self._db.execute(
            "SELECT * FROM environments WHERE run_id=? AND name=?", (run_id, name)
        ).fetchone()
        if row is None:
            raise BenchmarkError(f"run {run_id} has no environment {name!r}")
        return _environment(row)

    def environments(self, run_id: int) -> list[EnvironmentRecord]:
        rows = self._db.execute("SELECT * FROM environments WHERE run_id=? ORDER BY id", (run_id,))
        return [_environment(r) for r in rows]

    # -- samples ------------------------------------------------------------------------

    def add_sample(self, run_id: int, sample: NewSample) -> int:
        """Write one sample and its metric values in one committed transaction."""
        env_id = self.environment(run_id, sample.env).id
        with self._transaction():
            cur = self._db.execute(
                "INSERT INTO samples (run_id, env_id, suite, np, repetition, warmup, position, "
                "ok, error, log_path, workdir, started_at, host_seconds, guest_seconds, "
                "evidence_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    env_id,
                    sample.suite,
                    NO_NP if sample.np is None else sample.np,
                    sample.repetition,
                    int(sample.warmup),
                    sample.position,
                    int(sample.ok),
                    sample.error,
                    sample.log_path,
                    sample.workdir,
                    sample.started_at,
                    sample.host_seconds,
                    sample.guest_seconds,
                    _dumps(sample.evidence),
                ),
            )
            sample_id = cur.lastrowid
            assert sample_id is not None
            self._db.executemany(
                "INSERT INTO metric_values (sample_id, metric, unit, higher_is_better, value, "
                "error) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (sample_id, m.metric, m.unit, int(m.higher_is_better), m.value, m.error)
                    for m in sample.metrics
                ],
            )
        return sample_id

    def samples(self, run_id: int, *, include_warmup: bool = True) -> list[SampleRecord]:
        """Every sample of a run in the order they were taken, with their metrics."""
        where = "" if include_warmup else " AND s.warmup = 0"
        rows = self._db.execute(
            "SELECT s.*, e.name AS env FROM samples s JOIN environments e ON e.id = s.env_id "
            f"WHERE s.run_id=?{where} ORDER BY s.id",
            (run_id,),
        ).fetchall()
        metrics: dict[int, list[MetricRecord]] = {}
        for m in self._db.execute(
            "SELECT m.* FROM metric_values m JOIN samples s ON s.id = m.sample_id "
            "WHERE s.run_id=? ORDER BY m.sample_id, m.rowid",
            (run_id,),
        ):
            metrics.setdefault(m["sample_id"], []).append(
                MetricRecord(
                    metric=m["metric"],
                    unit=m["unit"],
                    higher_is_better=bool(m["higher_is_better"]),
                    value=m["value"],
                    error=m["error"],
                )
            )
        return [_sample(r, metrics.get(r["id"], [])) for r in rows]

    def set_outliers(self, run_id: int, marks: Iterable[tuple[int, str]]) -> None:
        """Mark exactly these (sample id, metric) values of the run as outlying (the
        values stay; the marks are recomputed as samples arrive)."""
        with self._transaction():
            self._db.execute(
                "DELETE FROM flags WHERE kind='outlier' AND sample_id IN "
                "(SELECT id FROM samples WHERE run_id=?)",
                (run_id,),
            )
            self._db.executemany(
                "INSERT INTO flags (sample_id, metric, kind) VALUES (?, ?, 'outlier')",
                list(marks),
            )

    def outliers(self, run_id: int) -> set[tuple[int, str]]:
        """(sample id, metric) of the run's values marked as outlying."""
        rows = self._db.execute(
            "SELECT f.sample_id, f.metric FROM flags f JOIN samples s ON s.id = f.sample_id "
            "WHERE s.run_id=? AND f.kind='outlier'",
            (run_id,),
        )
        return {(r[0], r[1]) for r in rows}

    def completed(self, run_id: int) -> set[SampleKey]:
        """Keys of the samples a run has finished (ok or failed): what a resume skips."""
        rows = self._db.execute(
            "SELECT e.name, s.suite, s.np, s.repetition, s.warmup FROM samples s "
            "JOIN environments e ON e.id = s.env_id WHERE s.run_id=?",
            (run_id,),
        )
        return {
            SampleKey(
                env=r[0],
                suite=r[1],
                np=None if r[2] == NO_NP else r[2],
                repetition=r[3],
                warmup=bool(r[4]),
            )
            for r in rows
        }


def _existing_db(path: Path, *, create: bool) -> Path:
    """The database file of ``path``; made ready to create (its directory) when
    ``create``; UsageError when missing, BenchmarkError when this user may not look."""
    try:
        file = db_path(path)
        exists = file.exists()
    except PermissionError:  # a directory on the way this user may not enter
        closed = next((p for p in reversed(path.absolute().parents) if not _can_enter(p)), path)
        raise BenchmarkError(
            f"{path} cannot be read by this user: {closed} may not be entered (permission "
            f"denied): ask its owner to make it readable (chmod a+rX {closed}), or to share "
            "a copy"
        ) from None
    if not exists:
        if not create:
            raise UsageError(
                f"no results database {file}: run `hpcvm bench --out {file.parent}` first"
            )
        file.parent.mkdir(parents=True, exist_ok=True)
    elif not os.access(file, os.R_OK):
        raise BenchmarkError(
            f"{file} cannot be read by this user (owner {_owner(file)}, mode "
            f"{file.stat().st_mode & 0o777:04o}): ask its owner to make it readable "
            f"(chmod a+r {file}), or to share a copy"
        )
    return file


def _can_enter(directory: Path) -> bool:
    return os.access(directory, os.X_OK)


def _owner(file: Path) -> str:
    try:
        return file.owner()
    except (KeyError, OSError):
        return f"uid {file.stat().st_uid}"


def _can_write(file: Path) -> bool:
    """Whether this process may write the database and make its journal files beside it
    (root may, unless the file system is read-only)."""
    return os.access(file, os.W_OK) and os.access(file.parent, os.W_OK | os.X_OK)


def _connect(file: Path) -> sqlite3.Connection:
    """The writer's connection: WAL journal, each commit on disk (module doc)."""
    connection = sqlite3.connect(file, timeout=30.0, isolation_level=None)
    try:
        connection.row_factory = sqlite3.Row
        connection.execute("PRAGMA foreign_keys = ON")
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
    except BaseException:
        connection.close()
        raise
    return connection


def _connect_readonly(file: Path) -> sqlite3.Connection:
    """A connection that writes nothing. ``mode=ro`` first: it reads through a live
    writer's ``-shm`` and ``-wal``. Where it fails because no ``-shm`` exists and the
    directory cannot take one, no writer has the database open, so ``immutable`` reads
    the file as it is (with a ``-wal`` beside it that would lose samples: refused)."""
    uri = file.absolute().as_uri()
    connection = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30.0, isolation_level=None)
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        connection.close()
        journals = [Path(f"{file}{s}") for s in ("-shm", "-wal")]
        if any(j.exists() for j in journals):
            raise
        connection = sqlite3.connect(
            f"{uri}?mode=ro&immutable=1", uri=True, timeout=30.0, isolation_level=None
        )
    connection.row_factory = sqlite3.Row
    return connection


def _in_memory(source: sqlite3.Connection) -> sqlite3.Connection:
    """A copy of ``source`` in memory (closed), for an upgrade that must not write it."""
    copy = sqlite3.connect(":memory:", isolation_level=None)
    try:
        source.backup(copy)
    finally:
        source.close()
    copy.row_factory = sqlite3.Row
    copy.execute("PRAGMA foreign_keys = ON")
    return copy


def _unreadable(file: Path, exc: sqlite3.DatabaseError) -> BenchmarkError:
    return BenchmarkError(f"{file} is not a readable hpcvm results database: {exc}")


def _journal_unreadable(file: Path, exc: sqlite3.DatabaseError) -> BenchmarkError:
    """A read-only reader that cannot use the journal files a writer left (a writer
    killed before it could fold its log into the database, in a directory this user
    cannot write)."""
    return BenchmarkError(
        f"{file} cannot be read without writing {file.parent} ({exc}: the write-ahead log "
        f"{file.name}-wal of a writer that did not finish is beside it): ask its owner to "
        f"run `hpcvm results {file.parent}` once where they can write the directory (it "
        "folds the log into the database)"
    )


def _run(row: sqlite3.Row, warning_envs: dict[str, str]) -> RunRecord:
    return RunRecord(
        id=row["id"],
        args=json.loads(row["args_json"]),
        host=None if row["host_json"] is None else json.loads(row["host_json"]),
        seed=row["seed"],
        confidence=row["confidence"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        elapsed_s=row["elapsed_s"],
        status=row["status"],
        stop_reason=row["stop_reason"],
        stop_detail=row["stop_detail"],
        error=row["error"],
        warnings=tuple(json.loads(row["warnings_json"])),
        hpcvm_version=row["hpcvm_version"],
        warning_envs=warning_envs,
    )


def _environment(row: sqlite3.Row) -> EnvironmentRecord:
    return EnvironmentRecord(
        id=row["id"],
        run_id=row["run_id"],
        name=row["name"],
        kind=row["kind"],
        profile=row["profile"],
        plan=None if row["plan_json"] is None else json.loads(row["plan_json"]),
        accel=row["accel"],
        cpu_model=row["cpu_model"],
        versions=json.loads(row["versions_json"]),
        vcpus=row["vcpus"],
        memory_bytes=row["memory_bytes"],
        variant=json.loads(row["variant_json"]),
    )


def _sample(row: sqlite3.Row, metrics: list[MetricRecord]) -> SampleRecord:
    return SampleRecord(
        id=row["id"],
        run_id=row["run_id"],
        env=row["env"],
        suite=row["suite"],
        np=None if row["np"] == NO_NP else row["np"],
        repetition=row["repetition"],
        warmup=bool(row["warmup"]),
        position=row["position"],
        ok=bool(row["ok"]),
        error=row["error"],
        log_path=row["log_path"],
        workdir=row["workdir"],
        started_at=row["started_at"],
        host_seconds=row["host_seconds"],
        guest_seconds=row["guest_seconds"],
        evidence=json.loads(row["evidence_json"]),
        metrics=tuple(metrics),
    )
