"""The openfoam suite for real, natively, at the smallest size: Debian's OpenFOAM meshes,
decomposes and solves the cavity tutorial under real Open MPI, through the real runner.

Oracles, none of them the suite's parser: the solver's own log lines split here with
``str.split`` (ExecutionTime, ClockTime, "Time =" and the residual lines), OpenFOAM's
``foamDictionary`` reading the prepared controlDict, the processor directories
decomposePar made, and a digest of the prepared case before and after samples. A
changed result is made for real: a boundary value edited in one processor's initial
field, or the case decomposed again another way after native's answer was taken; each
must be a failed sample whose reason says what differs. About 15 s natively.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcvm.bench.envs.environments import CLEAN_ENV
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.results.failures import cell_failures, failure_line
from hpcvm.bench.suites.openfoam.suite import (
    CPU_PER_STEP,
    DECOMPOSE_PAR_DICT,
    MESH,
    SIZES,
    WALL_PER_STEP,
    OpenfoamSuite,
    foam_argv,
)
from tests.apps_support import run_samples, tree_digest

pytestmark = pytest.mark.integration

NPS = (1, 2)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[OpenfoamSuite, Path]:
    if shutil.which("icoFoam") is None:
        pytest.skip("openfoam is not installed (scripts/setup.sh installs it)")
    suite = OpenfoamSuite("quick")
    suite.validate(NPS)
    inputs = tmp_path_factory.mktemp("openfoam") / "inputs"
    suite.prepare_inputs(inputs, NPS)
    return suite, inputs


def _foam_value(case: Path, entry: str) -> float:
    """An entry of the case's controlDict as OpenFOAM's own foamDictionary reads it."""
    argv = foam_argv(
        "foamDictionary", "-case", str(case), "-entry", entry, "-value",
        str(case / "system" / "controlDict"),
    )  # fmt: skip
    out = subprocess.run([*CLEAN_ENV, *argv], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])  # after a warning that the clean env has no PWD


def _run(suite: OpenfoamSuite, workdir: Path, np: int) -> tuple[str, list[float]]:
    """One sample as bench runs it natively: its stdout and parsed values."""
    argv = suite.prepare(workdir, np, 0)
    output = NativeEnvironment().run(argv, workdir, 600.0)
    values = suite.parse(workdir, output.stdout, output.stderr, output.exit_code)
    by_name = {v.name: v for v in values}
    assert by_name[CPU_PER_STEP.name].value is not None
    return output.stdout, [
        by_name[m.name].value if by_name[m.name].value is not None else -1.0
        for m in (CPU_PER_STEP, WALL_PER_STEP)
    ]


@pytest.mark.parametrize("np", NPS)
def test_metrics_are_the_solver_log_per_time_step(
    prepared: tuple[OpenfoamSuite, Path], tmp_path: Path, np: int
) -> None:
    suite, inputs = prepared
    before = tree_digest(inputs)
    stdout, (cpu, wall) = _run(suite, tmp_path / "work", np)
    lines = stdout.splitlines()
    timing = [line.split() for line in lines if line.startswith("ExecutionTime")]
    case = inputs / (MESH if np == 1 else f"np{np}")
    steps = round(_foam_value(case, "endTime") / _foam_value(case, "deltaT"))
    assert steps == SIZES["quick"].steps == len(timing)
    assert len([line for line in lines if line.startswith("Time = ")]) == steps
    # "ExecutionTime = 0.02 s  ClockTime = 0 s": tokens 2 and 6
    first, last = timing[0], timing[-1]
    assert cpu == pytest.approx((float(last[2]) - float(first[2])) / (steps - 1), abs=1e-12)
    clock = float(last[6]) - float(first[6])
    assert wall == (pytest.approx(clock / (steps - 1)) if clock > 0 else -1.0)
    # the nProcs header line says how many processes solved
    assert f"nProcs : {np}" in stdout
    # the sample only read the prepared case: every sample starts from the same state
    assert tree_digest(inputs) == before


def test_decomposition_and_reference_are_on_disk(prepared: tuple[OpenfoamSuite, Path]) -> None:
    suite, inputs = prepared
    processors = sorted(p.name for p in (inputs / "np2").glob("processor*"))
    assert processors == ["processor0", "processor1"]
    assert not list((inputs / MESH).glob("processor*"))
    # native's answer is the reference log's last step, read here from its lines
    log = (inputs / "np2" / "log.reference").read_text().splitlines()
    solves = [line for line in log if "Solving for" in line]
    last_step = solves[-len(suite.references[2]) :]
    expected = [
        float(re.search(r"Initial residual = (\S+),", line)[1])  # type: ignore[index]
        for line in last_step
    ]
    assert [r.initial for r in suite.references[2]] == expected


def _edit_lid_velocity(case: Path, processor: str, new: str) -> None:
    """The moving lid's value in one processor's initial velocity field, edited."""
    field = case / processor / "0" / "U"
    text = field.read_text()
    edited = re.sub(
        r"(movingWall\s*\{[^}]*value\s+uniform\s+)\(1 0 0\)", rf"\g<1>{new}", text, count=1
    )
    assert edited != text, f"no moving-wall value in {field}"
    field.write_text(edited)


def test_a_corrupted_input_field_is_a_failed_sample_with_the_reason(tmp_path: Path) -> None:
    suite = OpenfoamSuite("quick")
    suite.prepare_inputs(tmp_path / "inputs", [2])
    _edit_lid_velocity(tmp_path / "inputs" / "np2", "processor0", "(1.05 0 0)")
    samples = run_samples(tmp_path / "out", suite, 2)
    assert samples and not any(s.ok for s in samples)
    for s in samples:
        assert s.error is not None
        assert "the answer differs from native's" in s.error
        assert "initial residual" in s.error and "relative tolerance" in s.error
    (failure,) = cell_failures(samples)
    assert failure.given_up and "differs from native's" in failure_line(failure)


def test_another_decomposition_is_a_failed_sample_with_the_reason(tmp_path: Path) -> None:
    suite = OpenfoamSuite("quick")
    suite.prepare_inputs(tmp_path / "inputs", [2])
    case = tmp_path / "inputs" / "np2"
    # the same two ranks, but the mesh cut along y instead of x
    (case / "system" / "decomposeParDict").write_text(
        DECOMPOSE_PAR_DICT.format(np=2).replace("(2 1 1)", "(1 2 1)")
    )
    argv = foam_argv("decomposePar", "-case", str(case), "-force")
    subprocess.run([*CLEAN_ENV, *argv], capture_output=True, check=True)
    samples = run_samples(tmp_path / "out", suite, 2)
    assert samples and not any(s.ok for s in samples)
    assert all("the answer differs from native's" in (s.error or "") for s in samples)


def test_a_case_decomposed_for_other_ranks_is_a_failed_sample_with_openfoams_reason(
    tmp_path: Path,
) -> None:
    suite = OpenfoamSuite("quick")
    suite.prepare_inputs(tmp_path / "inputs", [2])
    case = tmp_path / "inputs" / "np2"
    (case / "system" / "decomposeParDict").write_text(DECOMPOSE_PAR_DICT.format(np=1))
    text = (case / "system" / "decomposeParDict").read_text().replace("(1 1 1)", "(3 1 1)")
    (case / "system" / "decomposeParDict").write_text(text.replace("Subdomains 1", "Subdomains 3"))
    argv = foam_argv("decomposePar", "-case", str(case), "-force")
    subprocess.run([*CLEAN_ENV, *argv], capture_output=True, check=True)
    samples = run_samples(tmp_path / "out", suite, 2)
    assert samples and not any(s.ok for s in samples)
    for s in samples:
        assert "icoFoam exited with code" in (s.error or "")
        assert "specifies 3 processors but job was started with 2" in (s.error or "")
