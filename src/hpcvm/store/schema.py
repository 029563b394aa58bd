"""The SQLite schema of a results database (``<out>/hpcvm.db``), and its version.

One file per results directory. Tables:

- ``meta``: key/value; ``schema_version`` (this module's SCHEMA_VERSION) and
  ``created_by`` (the hpcvm version that made the file).
- ``runs``: one row per ``hpcvm bench`` run: its arguments (JSON, what ``--resume``
  compares), the host snapshot (HostTopology JSON), seed, confidence, times, status
  (running, finished, interrupted, failed), which rule stopped it and the figures
  behind that (``stop_detail``), warnings (JSON list).
- ``warning_envs``: which environment a run's warning is about (by its text, as the
  warning is stored once per run); a warning not here is about the whole run.
- ``environments``: one row per environment of a run (``native``, ``container``,
  ``vm:<profile>[+variant]``): its kind, the plan (VMPlan JSON, NULL natively and in a
  container), accelerator (``native``, ``kvm``, ``tcg``), CPU model, software versions
  and observed facts (JSON: a container's runtime, a VM's guest THP mode...), vCPUs and
  memory it offered, and the VM variant (JSON: ``{"nic": "e1000", "page": 4096,
  "thp": "never"}``, the keys it sets, bench/envs/variants.py).
- ``samples``: one row per run of one suite in one environment: np (0 when the suite
  ignores it), repetition (block index; warm-ups are repetition 0 with ``warmup`` 1),
  position in its block's interleaved order, ok or failed with the error, the log and
  work directory kept, host wall seconds, guest-measured seconds, evidence (JSON:
  interrupts per second per source natively and in the guest, clock drift, KVM exits).
- ``metric_values``: the figures of one sample: metric, unit, direction, value (NULL
  when that figure failed, with ``error``).

Every sample is committed on its own (WAL journal), so an interrupted run keeps every
sample it finished.
"""

from __future__ import annotations

# 2: the flags table (outlying values, kept and marked); 3: the warning_envs table;
# 4: environments of kind container, and each environment's VM variant; 5: environments
# of any kind (a plugin's too: bench/envs/kinds.py)
SCHEMA_VERSION = 5

ENVIRONMENTS_TABLE = "environments"
# The environments table's definition, apart: a database older than schema 4 gets it
# (or, before 5, its wider kind) by a rebuild (migrate.py), as SQLite cannot widen a
# CHECK in place.
ENVIRONMENTS = """
CREATE TABLE IF NOT EXISTS environments (
    id            INTEGER PRIMARY KEY,
    run_id        INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name          TEXT    NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind <> ''),
    profile       TEXT,
    plan_json     TEXT,
    accel         TEXT    NOT NULL,
    cpu_model     TEXT    NOT NULL DEFAULT '',
    versions_json TEXT    NOT NULL DEFAULT '{}',
    vcpus         INTEGER NOT NULL,
    memory_bytes  INTEGER NOT NULL,
    variant_json  TEXT    NOT NULL DEFAULT '{}',
    UNIQUE (run_id, name)
);"""

TABLES = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id            INTEGER PRIMARY KEY,
    args_json     TEXT    NOT NULL,
    host_json     TEXT,
    seed          INTEGER NOT NULL,
    confidence    REAL    NOT NULL,
    started_at    REAL    NOT NULL,
    finished_at   REAL,
    elapsed_s     REAL    NOT NULL DEFAULT 0,
    status        TEXT    NOT NULL
        CHECK (status IN ('running', 'finished', 'interrupted', 'failed')),
    stop_reason   TEXT,
    stop_detail   TEXT,
    error         TEXT,
    warnings_json TEXT    NOT NULL DEFAULT '[]',
    hpcvm_version TEXT    NOT NULL
);
{ENVIRONMENTS}
CREATE TABLE IF NOT EXISTS samples (
    id            INTEGER PRIMARY KEY,
    run_id        INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    env_id        INTEGER NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    suite         TEXT    NOT NULL,
    np            INTEGER NOT NULL,
    repetition    INTEGER NOT NULL,
    warmup        INTEGER NOT NULL CHECK (warmup IN (0, 1)),
    position      INTEGER NOT NULL,
    ok            INTEGER NOT NULL CHECK (ok IN (0, 1)),
    error         TEXT,
    log_path      TEXT,
    workdir       TEXT,
    started_at    REAL    NOT NULL,
    host_seconds  REAL,
    guest_seconds REAL,
    evidence_json TEXT    NOT NULL DEFAULT '{}',
    UNIQUE (run_id, env_id, suite, np, repetition, warmup)
);
CREATE TABLE IF NOT EXISTS metric_values (
    sample_id        INTEGER NOT NULL REFERENCES samples(id) ON DELETE CASCADE,
    metric           TEXT    NOT NULL,
    unit             TEXT    NOT NULL,
    higher_is_better INTEGER NOT NULL CHECK (higher_is_better IN (0, 1)),
    value            REAL,
    error            TEXT,
    PRIMARY KEY (sample_id, metric)
);
CREATE INDEX IF NOT EXISTS samples_by_run ON samples (run_id, env_id, suite, np);
CREATE TABLE IF NOT EXISTS warning_envs (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    text   TEXT    NOT NULL,
    env    TEXT    NOT NULL,
    PRIMARY KEY (run_id, text)
);
CREATE TABLE IF NOT EXISTS flags (
    sample_id INTEGER NOT NULL REFERENCES samples(id) ON DELETE CASCADE,
    metric    TEXT    NOT NULL,
    kind      TEXT    NOT NULL CHECK (kind IN ('outlier')),
    PRIMARY KEY (sample_id, metric, kind)
);
""".replace("{ENVIRONMENTS}", ENVIRONMENTS.strip())
