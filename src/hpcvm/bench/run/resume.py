"""Which run a bench continues: none for a new results directory, the recorded one with
``--resume`` when it was asked the same (``BenchConfig.identity``), and a one-line
refusal for an ``--out`` that holds another run or a resume that changed what defines
the measurement.
"""

from __future__ import annotations

from pathlib import Path

from hpcvm.bench.run.config import BenchConfig
from hpcvm.errors import UsageError
from hpcvm.store import RunRecord, Store, db_path


def recorded_config(out_dir: Path) -> BenchConfig:
    """The configuration of the latest run in ``out_dir`` (``--resume`` with no other
    arguments continues it as it was)."""
    with Store.open(out_dir) as store:
        run = store.run()
    return BenchConfig.model_validate(run.args["config"])


def resume_target(config: BenchConfig, out_dir: Path, resume: bool) -> RunRecord | None:
    """The run to continue, or None for a new run; refuse an --out that holds another."""
    if not db_path(out_dir).exists():
        if resume:
            raise UsageError(f"--resume: {out_dir} holds no results database to continue")
        return None
    with Store.open(out_dir) as store:
        runs = store.runs()
    if not runs:
        return None
    run = runs[-1]
    if not resume:
        if run.status == "failed":
            return None  # a new run beside it: a failure never blocks its directory
        raise UsageError(
            f"{out_dir} already holds the results of run {run.id} ({run.status}): continue it "
            "with --resume or choose another --out"
        )
    recorded = BenchConfig.model_validate(run.args["config"])
    if recorded.identity() != config.identity():
        changed = sorted(
            k for k in config.identity() if config.identity()[k] != recorded.identity().get(k)
        )
        fresh = ", start a new run there without --resume" if run.status == "failed" else ""
        raise UsageError(
            f"--resume: the run in {out_dir} was made with different {', '.join(changed)}; "
            f"repeat its arguments (or give only --resume --out){fresh} or choose another --out"
        )
    if config.seed is not None and config.seed != run.seed:
        raise UsageError(
            f"--resume: the run in {out_dir} used --seed {run.seed}, not {config.seed}"
        )
    return run
