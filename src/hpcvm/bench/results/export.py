"""JSON and CSV exports of a run's samples and summaries (written into the out dir).

- ``summary.json`` / ``summary.csv``: one object/line per ResultRow (results.py).
- ``samples.json``: every sample with its metrics and evidence, as stored.
- ``samples.csv``: one line per sample and metric (a failed sample with no metrics gets
  one line with an empty metric), flat columns for spreadsheets.

Files are written to a temporary name and renamed, so an interrupted export never
leaves half a file where a complete one is expected.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcvm.bench.results.results import ResultRow, outlier_marks
from hpcvm.store import SampleRecord

SUMMARY_JSON = "summary.json"
SUMMARY_CSV = "summary.csv"
SAMPLES_JSON = "samples.json"
SAMPLES_CSV = "samples.csv"

SAMPLE_COLUMNS = (
    "run_id",
    "sample_id",
    "env",
    "suite",
    "np",
    "repetition",
    "warmup",
    "position",
    "ok",
    "error",
    "metric",
    "unit",
    "higher_is_better",
    "value",
    "outlier",
    "metric_error",
    "host_seconds",
    "guest_seconds",
    "interrupts_host_per_s",
    "interrupts_guest_per_s",
    "clock_drift",
    "clock_uncertainty",
    "clock_flagged",
    "started_at",
    "log_path",
    "workdir",
)


def rows_json(rows: Sequence[ResultRow]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in rows]


def rows_csv(rows: Sequence[ResultRow]) -> str:
    columns = list(ResultRow.model_fields)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        record = r.model_dump(mode="json")
        record["warnings"] = " | ".join(r.warnings)
        record["facts"] = "; ".join(f"{k}: {v}" for k, v in r.facts.items())
        writer.writerow({k: "" if v is None else v for k, v in record.items()})
    return out.getvalue()


def samples_json(samples: Sequence[SampleRecord]) -> list[dict[str, Any]]:
    return [s.model_dump(mode="json") for s in samples]


def _sample_base(s: SampleRecord) -> dict[str, Any]:
    totals = s.evidence.get("interrupts_total", {})
    clock = s.evidence.get("clock", {})
    totals = totals if isinstance(totals, dict) else {}
    clock = clock if isinstance(clock, dict) else {}
    return {
        "run_id": s.run_id,
        "sample_id": s.id,
        "env": s.env,
        "suite": s.suite,
        "np": s.np,
        "repetition": s.repetition,
        "warmup": s.warmup,
        "position": s.position,
        "ok": s.ok,
        "error": s.error,
        "host_seconds": s.host_seconds,
        "guest_seconds": s.guest_seconds,
        "interrupts_host_per_s": totals.get("host"),
        "interrupts_guest_per_s": totals.get("guest"),
        "clock_drift": clock.get("relative"),
        "clock_uncertainty": clock.get("uncertainty"),
        "clock_flagged": clock.get("flagged"),
        "started_at": s.started_at,
        "log_path": s.log_path,
        "workdir": s.workdir,
    }


def samples_csv(samples: Sequence[SampleRecord]) -> str:
    marked = set(outlier_marks(samples))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=SAMPLE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for s in samples:
        base = _sample_base(s)
        metrics = s.metrics or ()
        if not metrics:
            writer.writerow({k: "" if v is None else v for k, v in base.items()})
        for m in metrics:
            line = base | {
                "metric": m.metric,
                "unit": m.unit,
                "higher_is_better": m.higher_is_better,
                "value": m.value,
                "outlier": (s.id, m.metric) in marked,
                "metric_error": m.error,
            }
            writer.writerow({k: "" if v is None else v for k, v in line.items()})
    return out.getvalue()


def write_atomic(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole or keeps what it held: written beside it and renamed
    into place; a write that fails (a full disk) leaves no temporary file behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_exports(
    out_dir: Path, rows: Sequence[ResultRow], samples: Sequence[SampleRecord]
) -> list[Path]:
    """The four export files in ``out_dir``; their paths."""
    files = {
        out_dir / SUMMARY_JSON: json.dumps(rows_json(rows), indent=2) + "\n",
        out_dir / SUMMARY_CSV: rows_csv(rows),
        out_dir / SAMPLES_JSON: json.dumps(samples_json(samples), indent=2) + "\n",
        out_dir / SAMPLES_CSV: samples_csv(samples),
    }
    for path, text in files.items():
        write_atomic(path, text)
    return list(files)
