"""The lammps suite for real, natively, at the smallest size: Debian's LAMMPS runs the LJ
benchmark under real Open MPI, through the real runner.

Oracles, none of them the suite's parser: LAMMPS's own log file (``log.lammps``, which
rank 0 writes beside the screen output the suite reads), split here with
``str.split``: its "Loop time" line and the TotEng column of its last thermo row; the
"Created N atoms" line against the fcc count of the box. A changed result is made for
real: the sample's input edited (another initial temperature) after ``prepare`` wrote
it, so LAMMPS runs another problem; that must be a failed sample whose reason says what
differs. A few seconds natively.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpcvm.bench.core.metrics import ParseError
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.suites.lammps.suite import INPUT_FILE, LOG_FILE, STEPS, LammpsSuite
from tests.apps_support import run_samples

pytestmark = pytest.mark.integration

NPS = (1, 2)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> LammpsSuite:
    if shutil.which("lmp") is None:
        pytest.skip("lammps is not installed (scripts/setup.sh installs it)")
    suite = LammpsSuite("quick")
    suite.validate(NPS)
    suite.prepare_inputs(tmp_path_factory.mktemp("lammps") / "inputs", NPS)
    return suite


def _log_figures(log: str) -> tuple[float, int, int, int, float]:
    """Loop time, procs, steps, atoms and the last TotEng, from LAMMPS's log file."""
    lines = log.splitlines()
    # "Loop time of 0.0104905 on 2 procs for 100 steps with 500 atoms"
    (loop,) = [line.split() for line in lines if line.startswith("Loop time of")]
    at = next(i for i, line in enumerate(lines) if line.startswith("Loop time of"))
    header = next(lines[i].split() for i in range(at, -1, -1) if lines[i].startswith("Step "))
    last_row = lines[at - 1].split()
    energy = float(last_row[header.index("TotEng")])
    return float(loop[3]), int(loop[5]), int(loop[8]), int(loop[11]), energy


@pytest.mark.parametrize("np", NPS)
def test_loop_time_and_energy_are_lammps_own_log(
    prepared: LammpsSuite, tmp_path: Path, np: int
) -> None:
    argv = prepared.prepare(tmp_path, np, 0)
    output = NativeEnvironment().run(argv, tmp_path, 600.0)
    (value,) = prepared.parse(tmp_path, output.stdout, output.stderr, output.exit_code)
    log = (tmp_path / LOG_FILE).read_text()
    loop, procs, steps, atoms, energy = _log_figures(log)
    assert value.value == loop
    assert (procs, steps) == (np, STEPS)
    assert f"Created {atoms} atoms" in log and atoms == 4 * 5**3  # 5x5x5 fcc cells
    facts = prepared.sample_facts(tmp_path, output.stdout, output.stderr, output.exit_code)
    assert float(facts["total_energy"]) == energy == prepared.references[np]


class HotterInput(LammpsSuite):
    """The real suite, whose sample input is edited after prepare wrote it: the melt
    starts from another temperature, so LAMMPS really runs another problem."""

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        argv = super().prepare(workdir, np, memory_bytes)
        text = (workdir / INPUT_FILE).read_text()
        assert "create 1.44 " in text
        (workdir / INPUT_FILE).write_text(text.replace("create 1.44 ", "create 1.4401 "))
        return argv


def _errors(samples: Sequence[object]) -> list[str]:
    return [str(getattr(s, "error", "")) for s in samples]


def test_a_changed_input_is_a_failed_sample_with_the_reason(
    prepared: LammpsSuite, tmp_path: Path
) -> None:
    suite = HotterInput("quick")
    suite.references = dict(prepared.references)  # native's answers, as prepared
    samples = run_samples(tmp_path / "out", suite, 2)
    assert samples and not any(s.ok for s in samples)
    for error in _errors(samples):
        assert "lammps: the answer differs from native's: the final total energy is" in error
        assert "where native's is" in error and "relative tolerance" in error


def test_a_wrong_process_count_is_a_failed_sample(prepared: LammpsSuite, tmp_path: Path) -> None:
    """The record says np 2 but LAMMPS ran on 1: the sample does not count."""
    argv = prepared.prepare(tmp_path, 1, 0)
    record = (tmp_path / "hpcvm-run.json").read_text().replace('"np": 1', '"np": 2')
    (tmp_path / "hpcvm-run.json").write_text(record)
    output = NativeEnvironment().run(argv, tmp_path, 600.0)
    with pytest.raises(ParseError, match="LAMMPS ran on 1 procs where 2 were started"):
        prepared.parse(tmp_path, output.stdout, output.stderr, output.exit_code)
