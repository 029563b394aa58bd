"""The bsp suite: its metrics from known step times, and the real program under mpirun.

The metrics are checked on times whose answer is known (one rank late by d in every step
costs d/G; a quiet machine costs nothing); the program itself is built by ``make all``
and run here natively on 1 and 2 ranks through the suite's own argv, then read back.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from hpcvm.bench.core.metrics import ParseError
from hpcvm.bench.suites.bsp.suite import (
    COMPUTE_SLOWDOWN,
    GRAIN,
    ITERATIONS_FILE,
    RAW_FILE,
    SLOWDOWN,
    STEP,
    BspSuite,
    bsp_metrics,
    read_raw,
)
from hpcvm.bench.suites.registry import SuiteOptions, build_suites
from hpcvm.errors import UsageError


def _values(grains: np.ndarray, steps: np.ndarray) -> dict[str, float | None]:
    return {v.metric.name: v.value for v in bsp_metrics(grains, steps)}


def test_a_quiet_machine_has_no_slowdown() -> None:
    grains = np.full((4, 100), 100_000.0)
    steps = grains + 2_000.0
    v = _values(grains, steps)
    assert v[SLOWDOWN.name] == 0.0 and v[COMPUTE_SLOWDOWN.name] == 0.0
    assert v[STEP.name] == 102.0 and v[GRAIN.name] == 100.0


def test_one_late_rank_per_step_costs_d_over_g() -> None:
    g, d, c = 100_000.0, 7_000.0, 1_000.0
    grains = np.full((4, 100), g)
    for s in range(100):
        grains[s % 4, s] += d  # one rank, a different one each step, is late by d
    steps = np.full_like(grains, g + d + c)  # everyone leaves when the late one arrives
    v = _values(grains, steps)
    assert v[COMPUTE_SLOWDOWN.name] == pytest.approx(100.0 * d / g)
    assert v[SLOWDOWN.name] == pytest.approx(100.0 * d / (g + c))


def test_raw_file_is_read_and_malformed_refused(tmp_path: Path) -> None:
    path = tmp_path / RAW_FILE
    path.write_text("grain rank=0 5 6\ngrain rank=1 5 7\nstep rank=0 9 9\nstep rank=1 9 9\n")
    grains, steps = read_raw(path)
    assert grains.tolist() == [[5, 6], [5, 7]] and steps.shape == (2, 2)
    path.write_text("grain rank=0 5 6\nstep rank=0 9\n")
    with pytest.raises(ParseError, match="different numbers of steps"):
        read_raw(path)
    path.write_text("grain rank=0 5 6\n")
    with pytest.raises(ParseError, match="lack a rank"):
        read_raw(path)
    path.write_text("grain rank=x 5 6\n")
    with pytest.raises(ParseError, match="malformed"):
        read_raw(path)
    with pytest.raises(ParseError, match="cannot read"):
        read_raw(tmp_path / "absent")


def test_bad_options_are_refused() -> None:
    with pytest.raises(UsageError, match="steps and grain must be positive"):
        BspSuite(steps=0)
    with pytest.raises(UsageError, match="process counts"):
        BspSuite().validate([0])


def test_registered_with_the_bench_defaults() -> None:
    (suite,) = build_suites(["bsp"], SuiteOptions())
    assert isinstance(suite, BspSuite) and suite.uses_np


@pytest.mark.parametrize("np_", [1, 2])
def test_real_program_under_mpirun(tmp_path: Path, np_: int) -> None:
    suite = BspSuite(steps=200, grain_us=50)
    suite.validate([np_])
    suite.prepare_inputs(tmp_path / "inputs", [np_])
    kept = int((tmp_path / "inputs" / ITERATIONS_FILE).read_text())
    assert kept == suite.iterations and kept > 0
    again = BspSuite(steps=200, grain_us=50)
    again.prepare_inputs(tmp_path / "inputs", [np_])
    assert again.iterations == kept  # a resumed run does the very same work
    work = tmp_path / "work"
    argv = suite.prepare(work, np_, 0)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    values = {
        v.metric.name: v for v in suite.parse(work, done.stdout, done.stderr, done.returncode)
    }
    grains, steps = read_raw(work / RAW_FILE)
    assert grains.shape == (np_, 200)
    assert (steps >= grains).all()
    grain = values[GRAIN.name].value
    assert grain is not None and 5 < grain < 5_000  # about 50 us of work, here
    slowdown = values[SLOWDOWN.name].value
    assert slowdown is not None and slowdown >= 0.0
    with pytest.raises(ParseError, match="exited with code 3"):
        suite.parse(work, "", "boom", 3)
