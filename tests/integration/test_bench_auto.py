"""``hpcvm bench --reps auto --max-time`` natively, end to end: the real hpcc and noise
benchmarks, the real CLI, the database read back.

Each cell (native hpcc, native noise) must stop on its own rule; a cell that says it
met the target must have, by scipy's t interval recomputed from the stored values
(extreme statistics left out, and named as such); the time cap must hold to within one
sample of each cell. Nothing here asserts how long anything took.
"""

from __future__ import annotations

import math
import statistics
import subprocess
from pathlib import Path

import pytest
from scipy import stats as sps

from hpcvm.bench.suites.noise.suite import METRICS as NOISE_METRICS
from hpcvm.store import Store

pytestmark = pytest.mark.integration

VENV_HPCVM = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "hpcvm"
TARGET = 0.10
CAP_S = 15.0
EXTREME = {m.name for m in NOISE_METRICS if m.extreme}


def _relative_half_width(values: list[float], confidence: float) -> float:
    mean = statistics.fmean(values)
    if statistics.stdev(values) == 0.0:
        return 0.0  # scipy's interval of a zero scale is nan, not a point
    low, high = sps.t.interval(confidence, len(values) - 1, loc=mean, scale=sps.sem(values))
    return (high - low) / 2 / abs(mean)


def test_auto_stops_each_native_cell_on_its_own_within_the_cap(tmp_path: Path) -> None:
    out = tmp_path / "r"
    argv = [
        str(VENV_HPCVM),
        "bench",
        "--env",
        "native",
        "--suite",
        "hpcc",
        "--suite",
        "noise",
        "--size",
        "quick",
        "--noise-quanta",
        "2000",
        "--reps",
        "auto",
        "--target",
        f"{TARGET:.0%}",
        "--max-time",
        f"{CAP_S:g}s",
        "--out",
        str(out),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    with Store.open(out) as store:
        run = store.run()
        samples = store.samples(run.id)
    assert run.status == "finished"
    assert run.stop_reason in ("target", "max-reps", "max-time")
    detail = run.stop_detail or ""
    assert f"not judged (extreme statistics): {', '.join(sorted(EXTREME))}" in detail
    measured = [s for s in samples if not s.warmup]
    longest: dict[str, float] = {}
    for suite in ("hpcc", "noise"):
        mine = [s for s in measured if s.suite == suite]
        assert len(mine) >= 3  # the minimum, whatever the cap
        longest[suite] = max(s.host_seconds or 0.0 for s in samples if s.suite == suite)
        where = f"native {suite}" + (" np=1" if suite == "hpcc" else "")
        said = detail.split(f"{where}: ", 1)[1].split(" ", 1)[0]
        assert said in ("target", "max-reps", "max-time"), detail
        if said != "target":
            continue
        by_metric: dict[str, list[float]] = {}
        for s in mine:
            for m in s.metrics:
                if m.value is not None and "@" not in m.metric:
                    by_metric.setdefault(m.metric, []).append(m.value)
        judged = {k: v for k, v in by_metric.items() if k not in EXTREME}
        assert judged
        for metric, values in judged.items():
            assert _relative_half_width(values, run.confidence) <= TARGET + 1e-9, metric
    # The cap is checked after every sample: it can be passed by at most one sample of
    # each cell (plus what the runner itself spends around a sample).
    assert run.elapsed_s < CAP_S + sum(longest.values()) + 5.0
    assert not math.isnan(run.elapsed_s)
