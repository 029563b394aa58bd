"""The application suites' pure parts: registry entries, answer checks, log reading at
its edges (a run cut off, a fatal error, a clock that did not move), the launcher of
reference runs and the guest share of prepared inputs. The applications themselves run
in tests/integration/test_openfoam.py, test_lammps.py and test_bench_apps_vm.py; the
short logs here follow the layout of those real runs (trailing blanks dropped)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpcvm.bench.core.launch import Spread, across, mpirun_argv
from hpcvm.bench.core.metrics import ParseError
from hpcvm.bench.core.suite import DescribesSamples, PreparesInputs, Suite
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.session import INPUTS, _guest_shares
from hpcvm.bench.suites.lammps.suite import (
    ENERGY_RTOL,
    INPUT,
    LammpsSuite,
    atoms,
    energy_mismatch,
    error_line,
    parse_output,
)
from hpcvm.bench.suites.openfoam.log import Residual, Step, fatal_error, parse_log
from hpcvm.bench.suites.openfoam.suite import (
    RESIDUAL_RTOL,
    SIZES,
    WALL_PER_STEP,
    OpenfoamSuite,
    answer_mismatch,
    step_metrics,
)
from hpcvm.bench.suites.reference import reference_mpirun, relative_difference, run_step
from hpcvm.bench.suites.registry import REGISTRY, SuiteOptions, build_suites, suite_packages
from hpcvm.errors import BenchmarkError, UsageError

# --- registry ----------------------------------------------------------------------------


def test_both_suites_are_registered_with_sizes_packages_and_labels() -> None:
    from hpcvm.report.labels import label

    options = SuiteOptions(openfoam_size="quick", lammps_size="medium")
    openfoam, lammps = build_suites(["openfoam", "lammps"], options)
    assert isinstance(openfoam, OpenfoamSuite) and openfoam.case_size == SIZES["quick"]
    assert isinstance(lammps, LammpsSuite) and lammps.atoms == 32000  # the benchmark's
    for suite in (openfoam, lammps):
        assert isinstance(suite, Suite)
        assert isinstance(suite, PreparesInputs) and isinstance(suite, DescribesSamples)
        assert suite.uses_np and REGISTRY[suite.name].spans_nodes
    assert {"openfoam", "openfoam-examples", "lammps"} <= set(suite_packages())
    assert label("openfoam", "cpu_per_step", 2) == "OpenFOAM CPU/step 2"
    assert label("lammps", "loop_time", 4) == "LAMMPS loop 4"


@pytest.mark.parametrize("suite", [OpenfoamSuite, LammpsSuite])
def test_an_unknown_size_is_refused(suite: type[OpenfoamSuite] | type[LammpsSuite]) -> None:
    with pytest.raises(UsageError, match="use quick, small, medium"):
        suite("huge")


def test_openfoam_refuses_more_ranks_than_slabs() -> None:
    with pytest.raises(UsageError, match="at most 20 ranks, not 21; use a larger --size"):
        OpenfoamSuite("quick").validate([2, 21])


def test_a_sample_without_prepared_inputs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="no prepared case for np 2"):
        OpenfoamSuite("quick").prepare(tmp_path, 2, 0)
    with pytest.raises(BenchmarkError, match="no native reference for np 2"):
        LammpsSuite("quick").prepare(tmp_path, 2, 0)


@pytest.mark.parametrize("suite", [OpenfoamSuite("quick"), LammpsSuite("quick")])
def test_a_sample_without_its_reference_record_does_not_count(
    suite: OpenfoamSuite | LammpsSuite, tmp_path: Path
) -> None:
    with pytest.raises(ParseError, match="native reference this sample must match is unknown"):
        suite.parse(tmp_path, "End\n", "", 0)


# --- reference runs and shares ---------------------------------------------------------


def test_reference_runs_stay_on_this_node_unbound_and_may_oversubscribe() -> None:
    with across(Spread(nodes=2, network="10.0.0.0/24")):
        spread = mpirun_argv(4, ["x"])
        argv = reference_mpirun(4, ["x"])
    assert "isolated" not in spread
    assert "isolated" in argv and "--oversubscribe" in argv
    assert argv[argv.index("--bind-to") + 1] == "none"
    with pytest.raises(UsageError, match="cannot bind"):
        mpirun_argv(2, ["x"], oversubscribe=True)


def test_prepared_inputs_are_shared_with_guests_only_where_they_would_not_see_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = BenchConfig(envs=("vm:naive",), suites=("openfoam",))
    suites = [OpenfoamSuite("quick")]
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.chdir("/")
    assert _guest_shares(config, suites, elsewhere / "out") == ()  # / covers everything
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    shared = _guest_shares(config, suites, elsewhere / "out")
    assert shared == (str((elsewhere / "out" / INPUTS).resolve()),)
    assert _guest_shares(config, suites, work / "out") == ()  # under the working directory
    hpcc = BenchConfig(envs=("vm:naive",), suites=("hpcc",))
    assert _guest_shares(hpcc, build_suites(["hpcc"], SuiteOptions()), elsewhere) == ()


def test_relative_difference() -> None:
    assert relative_difference(1.0, 1.0) == 0.0
    assert relative_difference(0.0, 0.0) == 0.0
    assert relative_difference(1.0, 0.0) == float("inf")
    assert relative_difference(-4.6, -4.0) == pytest.approx(0.15)


# --- OpenFOAM's log ------------------------------------------------------------------------

_STEP = """Time = {t}

Courant Number mean: 0.222158 max: 0.852134
smoothSolver:  Solving for Ux, Initial residual = {ux}, Final residual = 6.3e-06, No Iterations 8
DICPCG:  Solving for p, Initial residual = {p}, Final residual = 2.8e-05, No Iterations 10
time step continuity errors : sum local = 8.08001e-09, global = 3.9e-19, cumulative = 8.8e-18
ExecutionTime = {cpu} s  ClockTime = {clock} s

"""
_HEAD = "Build  : OPENFOAM=1912 patch=200626\nCase   : /c\nnProcs : 2\n"


def _log(*steps: tuple[float, float, float, float, float], end: bool = True) -> str:
    body = "".join(
        _STEP.format(t=t, ux=ux, p=p, cpu=cpu, clock=clock) for t, ux, p, cpu, clock in steps
    )
    return _HEAD + body + ("End\n" if end else "")


def test_a_log_gives_steps_residuals_and_the_header() -> None:
    log = parse_log(_log((0.005, 1.0, 1.0, 0.01, 0), (0.01, 0.5, 0.25, 0.03, 1)))
    assert (log.procs, log.case, log.ended) == (2, "/c", True)
    assert [s.time for s in log.steps] == [0.005, 0.01]
    assert [(r.field, r.initial) for r in log.steps[1].residuals] == [("Ux", 0.5), ("p", 0.25)]


def test_a_step_cut_off_before_its_timing_line_is_not_counted() -> None:
    text = _log((0.005, 1.0, 1.0, 0.01, 0), end=False) + "Time = 0.01\n\nsmoothSolver:  Solving"
    log = parse_log(text)
    assert len(log.steps) == 1 and not log.ended


def test_per_step_times_leave_out_the_first_step_and_say_when_the_clock_stood_still() -> None:
    steps = [
        Step(time=0.005 * i, residuals=(), cpu=cpu, clock=clock)
        for i, (cpu, clock) in enumerate([(0.5, 0.0), (0.6, 0.0), (0.9, 0.0)], start=1)
    ]
    cpu, wall = step_metrics(steps)
    assert cpu.value == pytest.approx(0.2) and wall.value is None
    assert wall.metric == WALL_PER_STEP and "ClockTime did not advance" in (wall.error or "")
    moved = [s.model_copy(update={"clock": float(i)}) for i, s in enumerate(steps)]
    assert step_metrics(moved)[1].value == pytest.approx(1.0)
    with pytest.raises(ParseError, match="too few"):
        step_metrics(steps[:1])


def test_residuals_match_within_the_tolerance_only() -> None:
    native = [Residual(field="Ux", initial=2.8e-4), Residual(field="p", initial=6.0e-4)]
    near = [r.model_copy(update={"initial": r.initial * (1 + RESIDUAL_RTOL / 2)}) for r in native]
    assert answer_mismatch(native, native) is None
    assert answer_mismatch(near, native) is None
    off = [native[0], Residual(field="p", initial=6.1e-4)]
    reason = answer_mismatch(off, native)
    assert reason is not None and "p initial residual is 0.00061 where native's is 0.0006" in reason
    twice = [*native, Residual(field="p", initial=5e-4)]
    changed = [*native, Residual(field="p", initial=4e-4)]
    assert "p (2nd solve)" in (answer_mismatch(changed, twice) or "")
    assert "solved Ux where native's solved Ux, p" in (answer_mismatch(native[:1], native) or "")


def test_openfoams_fatal_error_is_the_reason() -> None:
    stderr = (
        '\n\n[0] --> FOAM FATAL ERROR: \n[0] Cannot read decomposeParDict from "/c/system"\n'
        "[0] \nFOAM parallel run exiting\n[0] \n"
    )
    assert fatal_error("", stderr) == 'Cannot read decomposeParDict from "/c/system"'
    serial = "--> FOAM FATAL ERROR: \nattempt to run parallel on 1 processor\n\n    From function"
    assert fatal_error("", serial) == "attempt to run parallel on 1 processor"
    assert fatal_error("all well", "") == ""


# --- LAMMPS's output -------------------------------------------------------------------------

_LAMMPS = """LAMMPS (29 Sep 2021 - Update 2)
Created 500 atoms
Step Temp E_pair E_mol TotEng Press
       0         1.44   -6.7733681            0   -4.6176881   -5.0221006
     100   0.75627408   -5.7580082            0   -4.6258659   0.21870071
Loop time of 0.0104905 on 2 procs for 100 steps with 500 atoms

Performance: 4118009.572 tau/day, 9532.430 timesteps/s
"""


def test_lammps_output_gives_the_loop_line_and_the_last_energy() -> None:
    run = parse_output(_LAMMPS)
    assert (run.loop_time, run.procs, run.steps, run.atoms) == (0.0104905, 2, 100, 500)
    assert (run.last_step, run.total_energy) == (100, -4.6258659)
    with pytest.raises(ParseError, match="no 'Loop time' line"):
        parse_output(_LAMMPS.split("Loop")[0])
    with pytest.raises(ParseError, match="no thermo table"):
        parse_output(_LAMMPS.replace("Step Temp", "Stop Temp"))


def test_lammps_energy_within_the_tolerance_only() -> None:
    assert energy_mismatch(-4.6258659, -4.6258659) is None
    assert energy_mismatch(-4.6258659 * (1 + ENERGY_RTOL / 2), -4.6258659) is None
    reason = energy_mismatch(-4.6258, -4.6258659)
    assert reason is not None and "is -4.6258 where native's is -4.6258659" in reason


def test_lammps_error_line_is_the_reason() -> None:
    out = "LAMMPS\nERROR: Unknown command: bad (src/input.cpp:274)\nLast command: bad\n"
    assert error_line(out, "") == "ERROR: Unknown command: bad"
    assert error_line("", "") == ""


def test_lammps_input_and_sizes_are_the_benchmarks() -> None:
    assert [atoms(s) for s in (0.25, 0.5, 1.0)] == [500, 4000, 32000]
    assert "velocity      all create 1.44 87287 loop geom" in INPUT
    assert INPUT.rstrip().endswith("run           100")


def test_a_failed_preparation_step_names_itself_and_its_log(tmp_path: Path) -> None:
    log = tmp_path / "log.step"
    argv = ["/bin/sh", "-c", "echo meshing; echo 'no such patch' >&2; exit 3"]
    with pytest.raises(BenchmarkError, match=r"blockMesh exited with code 3: no such patch"):
        run_step(argv, log=log, what="blockMesh")
    assert "meshing" in log.read_text() and "no such patch" in log.read_text()
    assert run_step(["/bin/echo", "ok"], log=log, what="echo") == "ok\n"


def test_a_preparation_step_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    argv = ["/bin/sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]
    with pytest.raises(BenchmarkError, match=r"did not finish within 0\.5 s"):
        run_step(argv, log=tmp_path / "log", what="decomposePar", timeout=0.5)
    status = Path(f"/proc/{pidfile.read_text().strip()}/status")
    deadline = time.monotonic() + 10
    while status.exists() and "State:\tZ" not in status.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not status.exists() or "State:\tZ" in status.read_text()  # gone, or a reaped-late zombie
