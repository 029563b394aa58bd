"""store stage of the hpcvm pipeline (see DESIGN.md): the SQLite results database.

Read API for reports: ``Store.open(dir)``, ``store.runs()``, ``store.run(id|None)``,
``store.environments(run_id)``, ``store.samples(run_id)``; schema in ``schema.py``.
"""

from typing import TYPE_CHECKING

from hpcvm.lazy import lazy_exports

if TYPE_CHECKING:
    from hpcvm.store.db import DB_NAME, WRITER_LOCK, Store, db_path, writer_lock_path
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
    from hpcvm.store.schema import SCHEMA_VERSION

__all__ = [
    "DB_NAME",
    "SCHEMA_VERSION",
    "WRITER_LOCK",
    "EnvironmentRecord",
    "MetricRecord",
    "NewEnvironment",
    "NewSample",
    "RunRecord",
    "RunStatus",
    "SampleKey",
    "SampleRecord",
    "Store",
    "db_path",
    "writer_lock_path",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "hpcvm.store.db": ("DB_NAME", "WRITER_LOCK", "Store", "db_path", "writer_lock_path"),
        "hpcvm.store.records": (
            "EnvironmentRecord",
            "MetricRecord",
            "NewEnvironment",
            "NewSample",
            "RunRecord",
            "RunStatus",
            "SampleKey",
            "SampleRecord",
        ),
        "hpcvm.store.schema": ("SCHEMA_VERSION",),
    },
)
