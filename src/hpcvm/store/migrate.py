"""What a database written by an older hpcvm gains when this one opens it.

Schema 4 widens the environments table: a kind ``container``, and each environment's VM
variant (``variant_json``); schema 5 takes any kind (a plugin's, bench/envs/kinds.py).
SQLite cannot change a CHECK constraint in place, so the table is rebuilt once
(``rebuild_environments``), as SQLite's documentation prescribes: foreign keys off, a
new table, the rows copied, the old one dropped, the new one renamed, the foreign keys
checked, all in one transaction. Every row keeps its id, so the samples that refer to it
stay attached.

Schema 3 records which environment a run warning is about (the ``warning_envs`` table).
Before it, that was said only in the warning's wording: an environment's warning began
with its name and ": " ("vm:hpc: planned with housekeeping 0 ..."). So, once, when a
database of version 1 or 2 is opened, each warning that begins so with the name of one
of its run's environments is recorded as that environment's. This is the one place that
reads a warning's owner from its text, and only for databases written before the owner
was data; every newer warning is stored with its owner by the code that raises it.
"""

from __future__ import annotations

import json
import sqlite3

WARNING_ENVS_SINCE = 3  # the schema version that records warning owners as data
WIDE_ENVIRONMENTS_SINCE = 5  # containers, variants, then any kind in the environments table


def rebuild_environments(db: sqlite3.Connection, definition: str, table: str) -> None:
    """Replace ``table`` by one made with ``definition`` (a CREATE TABLE IF NOT EXISTS
    of the same name), keeping every row and id (module doc). Call outside a
    transaction: foreign keys can only be switched off between transactions."""
    db.execute("PRAGMA foreign_keys = OFF")
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            fresh = f"{table}_new"
            old = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            db.execute(definition.replace(f" {table} (", f" {fresh} (", 1))
            new = [r[1] for r in db.execute(f"PRAGMA table_info({fresh})")]
            shared = ", ".join(c for c in new if c in old)
            db.execute(f"INSERT INTO {fresh} ({shared}) SELECT {shared} FROM {table}")
            db.execute(f"DROP TABLE {table}")
            db.execute(f"ALTER TABLE {fresh} RENAME TO {table}")
            broken = db.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise sqlite3.IntegrityError(f"{len(broken)} rows lost their {table} row")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    finally:
        db.execute("PRAGMA foreign_keys = ON")


def adopt_warning_envs(db: sqlite3.Connection) -> None:
    """Record the owner of every legacy warning that names one of its run's environments
    (call inside the transaction that upgrades the database)."""
    runs = db.execute("SELECT id, warnings_json, args_json FROM runs").fetchall()
    for run_id, warnings_json, args_json in runs:
        names = _env_names(db, run_id, args_json)
        for text in json.loads(warnings_json):
            owner = next((n for n in names if text.startswith(f"{n}: ")), None)
            if owner is not None:
                db.execute(
                    "INSERT OR IGNORE INTO warning_envs (run_id, text, env) VALUES (?, ?, ?)",
                    (run_id, text, owner),
                )


def _env_names(db: sqlite3.Connection, run_id: int, args_json: str) -> list[str]:
    """The run's environments: those it recorded, and those its arguments asked for (a
    run that failed while planning a VM recorded that VM's warnings, not the VM),
    longest first so that no name wins by being a prefix of another."""
    names = {r[0] for r in db.execute("SELECT name FROM environments WHERE run_id=?", (run_id,))}
    config = json.loads(args_json).get("config")
    if isinstance(config, dict) and isinstance(config.get("envs"), list):
        names |= {n for n in config["envs"] if isinstance(n, str)}
    return sorted(names, key=lambda n: (-len(n), n))
