"""OpenFOAM as its users run it: a tutorial case meshed, decomposed over the ranks, the
solver run in parallel, its answer checked against native's, its own timing read.

What runs (Debian 12's ``openfoam`` 1912, binaries in /usr/bin, its ``etc`` under
/usr/share/openfoam, found through ``WM_PROJECT_DIR``, the one variable its solvers
need; Debian's etc/bashrc, which would set it, looks for scripts Debian does not ship):
the lid-driven cavity of the first OpenFOAM tutorial (``openfoam-examples``:
incompressible/icoFoam/cavity/cavity), solved with ``icoFoam`` (transient, laminar,
PISO with PCG/DIC for pressure). ``--size`` sets the mesh and the number of time steps;
the time step shrinks with the cells so that the Courant number stays the tutorial's:

======  ============  =====  ===================================================
size    mesh          steps  natively, np 2, a shared 2-core host
======  ============  =====  ===================================================
quick   20 x 20       20     0.5 s a sample (a TCG guest: 4 to 30 s, with load)
small   50 x 50       100    2.7 s of solver CPU time
medium  100 x 100     200    7.9 s of solver CPU time
======  ============  =====  ===================================================

Prepared once per run (``prepare_inputs``, outside every sample): the tutorial copied,
its block mesh refined (``blockMesh``), the controlDict set with OpenFOAM's own
``foamDictionary`` (end time, time step, and a write interval past the end: the solver
writes nothing), then one copy per ``--np`` decomposed by ``decomposePar`` (method
``simple``, the mesh cut into np slabs along x; np 1 runs the undecomposed case
serially). A sample runs ``mpirun -np N icoFoam -case CASE -parallel`` straight on the
prepared case, which it only reads, so every sample starts from the same state without
a copy, and ranks on other nodes (``bench --nodes``) read their processor directory
where it is, as the first node does.

Metrics, from the solver's own log (stdout): ``ExecutionTime`` (the master's CPU time,
printed in 0.01 s steps) and ``ClockTime`` (wall time, whole seconds), each per time
step as (last - first) / (steps - 1), which leaves out the start-up (reading the mesh,
MPI) and the first step. ClockTime's 1 s step is coarse for short runs: a run in which
it did not advance has no wall figure (a failed metric saying so), and the resolution
warning says when either step is above 1% of the mean.

The answer: the initial residual of every equation solved in the last time step (Ux,
Uy and the pressure of each PISO corrector), OpenFOAM's own measure of where the
solution stands, compared with the native reference run's (bench/suites/reference.py). The
same binary on the same decomposition does the same arithmetic, so native and a guest
print the same residuals (a TCG guest does). The tolerance, 1e-4 relative (two of the
six digits OpenFOAM prints), leaves room for the last bits of a libm that picks another
code path on another CPU model; what changes the problem moves them further (measured
at np 2: the lid 0.1% faster in one processor's initial field, 3e-4 at quick; the mesh
cut along y instead of x, 5e-3 at quick and 2e-2 at small). A mismatch, a wrong process
count or step count is a failed sample.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

from hpcvm.bench.core.kind import SuiteKind, SuiteOptions, word_size
from hpcvm.bench.core.launch import Bind, find_program, in_workdir, mpirun_argv
from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError, tail
from hpcvm.bench.core.resolution import resolution_warning
from hpcvm.bench.core.suite import Suite, check_np_values
from hpcvm.bench.suites.openfoam import FLAGS
from hpcvm.bench.suites.openfoam.log import (
    SOLVER,
    Residual,
    SolverLog,
    Step,
    fatal_error,
    parse_log,
)
from hpcvm.bench.suites.reference import (
    read_run_file,
    reference_mpirun,
    relative_difference,
    run_step,
    write_run_file,
)
from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.model import Frozen

PACKAGES = ("openfoam", "openfoam-examples", "openmpi-bin")
PROJECT_DIR = Path("/usr/share/openfoam")  # Debian's WM_PROJECT_DIR (etc/controlDict)
TUTORIAL = Path("/usr/share/doc/openfoam-examples/examples/incompressible/icoFoam/cavity/cavity")
TUTORIAL_CELLS = 20  # per side, in the tutorial's blockMeshDict
TUTORIAL_DELTA_T = 0.005
ENV = "/usr/bin/env"
RESIDUAL_RTOL = 1e-4
CPU_STEP = 0.01  # ExecutionTime's printing step (cpuTime: clock ticks)
CLOCK_STEP = 1.0  # ClockTime's (whole seconds)
MESH = "mesh"  # the undecomposed case, also np 1's
REFERENCE_FILE = "hpcvm-reference.json"


class CaseSize(Frozen):
    """The cavity at one ``--size``: cells per side and time steps."""

    cells: int
    steps: int

    @property
    def delta_t(self) -> float:
        """The tutorial's time step scaled with the cell size (same Courant number)."""
        return TUTORIAL_DELTA_T * TUTORIAL_CELLS / self.cells


OpenfoamSize = Literal["quick", "small", "medium"]
SIZES: dict[str, CaseSize] = {
    "quick": CaseSize(cells=20, steps=20),
    "small": CaseSize(cells=50, steps=100),
    "medium": CaseSize(cells=100, steps=200),
}

CPU_PER_STEP = Metric(
    name="cpu_per_step",
    unit="s",
    higher_is_better=False,
    description="icoFoam's ExecutionTime (master's CPU time) per time step",
    short="OpenFOAM CPU/step",
)
WALL_PER_STEP = Metric(
    name="wall_per_step",
    unit="s",
    higher_is_better=False,
    description="icoFoam's ClockTime (wall time, whole seconds) per time step",
    short="OpenFOAM wall/step",
)
METRICS = (CPU_PER_STEP, WALL_PER_STEP)
RESOLUTION = {CPU_PER_STEP.name: CPU_STEP, WALL_PER_STEP.name: CLOCK_STEP}


def step_metrics(steps: Sequence[Step]) -> list[MetricValue]:
    """CPU and wall time per step after the first; wall failed when ClockTime did not
    move (the run was shorter than its 1 s step)."""
    if len(steps) < 2:
        raise ParseError(f"{SOLVER} ran {len(steps)} time step(s): too few to time one")
    first, last = steps[0], steps[-1]
    intervals = len(steps) - 1
    values = [CPU_PER_STEP.value((last.cpu - first.cpu) / intervals)]
    wall = last.clock - first.clock
    if wall <= 0:
        values.append(
            WALL_PER_STEP.failed(
                f"ClockTime did not advance over {intervals} time steps (it counts whole "
                "seconds): use a larger --size for a wall-time figure"
            )
        )
    else:
        values.append(WALL_PER_STEP.value(wall / intervals))
    return values


def answer(steps: Sequence[Step]) -> tuple[Residual, ...]:
    """The answer checked against native's: the last step's initial residuals."""
    if not steps:
        raise ParseError(f"{SOLVER} finished no time step")
    return steps[-1].residuals


def answer_mismatch(found: Sequence[Residual], reference: Sequence[Residual]) -> str | None:
    """Why ``found`` is not native's answer within RESIDUAL_RTOL; None when it is."""
    names = [r.field for r in found]
    wanted = [r.field for r in reference]
    if names != wanted:
        return (
            f"the last time step solved {', '.join(names) or 'nothing'} where native's solved "
            f"{', '.join(wanted)}"
        )
    off = [
        (i, got, ref)
        for i, (got, ref) in enumerate(zip(found, reference, strict=True))
        if relative_difference(got.initial, ref.initial) > RESIDUAL_RTOL
    ]
    if not off:
        return None
    i, got, ref = off[0]
    more = f" (and {len(off) - 1} more)" if len(off) > 1 else ""
    return (
        f"the last time step's {_nth(i, found)} initial residual is {got.initial:g} where "
        f"native's is {ref.initial:g}{more}, beyond the {RESIDUAL_RTOL:g} relative tolerance"
    )


def _nth(index: int, residuals: Sequence[Residual]) -> str:
    """``p`` or ``p (2nd solve)`` when the field is solved more than once in a step."""
    field = residuals[index].field
    same = [i for i, r in enumerate(residuals) if r.field == field]
    if len(same) == 1:
        return field
    ordinal = same.index(index) + 1
    return f"{field} ({ordinal}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(ordinal, 'th') } solve)"


# --- preparation ---------------------------------------------------------------------


def foam_argv(program: str, *args: str) -> list[str]:
    """An OpenFOAM program with the one variable it needs (module docstring)."""
    return [ENV, f"WM_PROJECT_DIR={PROJECT_DIR}", find_program(program, "openfoam"), *args]


def _refine(block_mesh_dict: Path, cells: int) -> None:
    """The tutorial's single block, ``(20 20 1)`` cells, made ``(cells cells 1)``."""
    text = block_mesh_dict.read_text()
    pattern = re.compile(rf"\({TUTORIAL_CELLS} {TUTORIAL_CELLS} 1\)")
    if len(pattern.findall(text)) != 1:
        raise BenchmarkError(
            f"{block_mesh_dict} is not the cavity tutorial hpcvm knows (one block of "
            f"{TUTORIAL_CELLS} x {TUTORIAL_CELLS} x 1 cells): reinstall openfoam-examples"
        )
    block_mesh_dict.write_text(pattern.sub(f"({cells} {cells} 1)", text))


def _set(case: Path, entry: str, value: str) -> None:
    run_step(
        foam_argv("foamDictionary", "-case", str(case), "-entry", entry, "-set", value,
                  str(case / "system" / "controlDict")),
        log=case / f"log.foamDictionary.{entry}",
        what=f"foamDictionary -entry {entry}",
    )  # fmt: skip


def make_mesh(case: Path, size: CaseSize) -> None:
    """The tutorial copied to ``case``, sized, meshed; the run writes nothing."""
    shutil.copytree(TUTORIAL, case)
    _refine(case / "system" / "blockMeshDict", size.cells)
    for entry, value in (
        ("deltaT", f"{size.delta_t:.12g}"),
        ("endTime", f"{size.delta_t * size.steps:.12g}"),
        ("writeControl", "timeStep"),
        ("writeInterval", str(10 * size.steps)),  # past the end: nothing is written
        ("runTimeModifiable", "false"),
    ):
        _set(case, entry, value)
    run_step(foam_argv("blockMesh", "-case", str(case)), log=case / "log.blockMesh",
             what="blockMesh")  # fmt: skip


DECOMPOSE_PAR_DICT = """FoamFile
{{
    version     2.0;
    format      ascii;
    class       dictionary;
    location    "system";
    object      decomposeParDict;
}}

numberOfSubdomains {np};

method          simple;

coeffs
{{
    n           ({np} 1 1);
}}
"""


def decompose(mesh: Path, case: Path, np: int) -> None:
    """``mesh`` copied to ``case`` and cut into ``np`` slabs along x by decomposePar."""
    shutil.copytree(mesh, case)
    (case / "system" / "decomposeParDict").write_text(DECOMPOSE_PAR_DICT.format(np=np))
    run_step(foam_argv("decomposePar", "-case", str(case)), log=case / "log.decomposePar",
             what=f"decomposePar for {np} ranks")  # fmt: skip


def solver_argv(case: Path, np: int) -> list[str]:
    """What every rank runs: the solver on the prepared case (in parallel for np > 1)."""
    return foam_argv(SOLVER, "-case", str(case), *(("-parallel",) if np > 1 else ()))


# --- the suite -------------------------------------------------------------------------


class OpenfoamSuite:
    """icoFoam on the cavity, prepared once per run, checked against native's answer."""

    name = "openfoam"
    uses_np = True
    metrics = METRICS
    output_files: tuple[str, ...] = ()  # the solver's log is its stdout

    def __init__(self, size: str = "small", *, bind: Bind = "core") -> None:
        if size not in SIZES:
            raise UsageError(f"unknown openfoam size {size!r}: use {', '.join(SIZES)}")
        self.size = size
        self.case_size = SIZES[size]
        self.bind: Bind = bind
        self.cases: dict[int, Path] = {}
        self.references: dict[int, tuple[Residual, ...]] = {}

    def validate(self, np_values: Sequence[int]) -> None:
        check_np_values(self.name, np_values)
        too_many = [n for n in np_values if n > self.case_size.cells]
        if too_many:
            raise UsageError(
                f"openfoam --size {self.size} has {self.case_size.cells} cells along x, cut "
                f"into one slab per rank: at most {self.case_size.cells} ranks, not "
                f"{too_many[0]}; use a larger --size"
            )
        for program in (SOLVER, "blockMesh", "decomposePar", "foamDictionary"):
            find_program(program, "openfoam")
        if not (PROJECT_DIR / "etc" / "controlDict").is_file():
            raise BenchmarkError(
                f"OpenFOAM's {PROJECT_DIR}/etc/controlDict is missing: install the Debian "
                "package openfoam (scripts/setup.sh does)"
            )
        if not (TUTORIAL / "system" / "blockMeshDict").is_file():
            raise BenchmarkError(
                f"the cavity tutorial {TUTORIAL} is missing: install the Debian package "
                "openfoam-examples (scripts/setup.sh does)"
            )
        mpirun_argv(1, [SOLVER], bind=self.bind)

    def prepare_inputs(self, directory: Path, np_values: Sequence[int]) -> None:
        """The mesh, one decomposition per np, and native's answer for each."""
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        make_mesh(directory / MESH, self.case_size)
        for np in dict.fromkeys(np_values):
            case = directory / MESH if np == 1 else directory / f"np{np}"
            if np > 1:
                decompose(directory / MESH, case, np)
            self.cases[np] = case
            self.references[np] = self._reference(case, np)

    def _reference(self, case: Path, np: int) -> tuple[Residual, ...]:
        out = run_step(
            reference_mpirun(np, solver_argv(case, np)),
            log=case / "log.reference",
            what=f"the native reference run of {SOLVER} at np {np}",
        )
        log = parse_log(out)
        problem = self._check_run(log, np)
        if problem:
            raise BenchmarkError(f"openfoam: the native reference run at np {np}: {problem}")
        found = answer(log.steps)
        (case / REFERENCE_FILE).write_text(
            json.dumps([r.model_dump() for r in found], indent=1) + "\n"
        )
        return found

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        case = self.cases.get(np)
        if case is None or np not in self.references:
            raise BenchmarkError(
                f"openfoam: no prepared case for np {np} (prepare_inputs was not run for it)"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        write_run_file(
            workdir,
            {
                "np": np,
                "case": str(case),
                "size": self.size,
                "steps": self.case_size.steps,
                "reference": [r.model_dump() for r in self.references[np]],
            },
        )
        return in_workdir(workdir, mpirun_argv(np, solver_argv(case, np), bind=self.bind))

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        run = read_run_file(workdir, self.name)
        if exit_code != 0:
            said = fatal_error(stdout, stderr) or tail(stderr, 3) or tail(stdout, 3) or "-"
            raise ParseError(f"{SOLVER} exited with code {exit_code}: {said}")
        log = parse_log(stdout)
        problem = self._check_run(log, int(run["np"]), int(run["steps"]), str(run["case"]))
        if problem:
            raise ParseError(f"openfoam: {problem}")
        reference = [Residual.model_validate(r) for r in run["reference"]]
        mismatch = answer_mismatch(answer(log.steps), reference)
        if mismatch:
            raise ParseError(f"openfoam: the answer differs from native's: {mismatch}")
        return step_metrics(log.steps)

    def _check_run(
        self, log: SolverLog, np: int, steps: int | None = None, case: str | None = None
    ) -> str | None:
        """Why the log is not a whole run of the prepared case at np; None if it is."""
        steps = self.case_size.steps if steps is None else steps
        if not log.ended:
            return f"{SOLVER}'s log has no End: the run stopped after {len(log.steps)} steps"
        if log.procs is not None and log.procs != np:
            return f"{SOLVER} ran on {log.procs} processes where {np} were started"
        if case is not None and log.case is not None and log.case != case:
            return f"{SOLVER} solved {log.case}, not the prepared case {case}"
        if len(log.steps) != steps:
            return f"{SOLVER} ran {len(log.steps)} time steps where the case asks for {steps}"
        return None

    # -- DescribesSamples -----------------------------------------------------------------

    def sample_facts(
        self, workdir: Path, stdout: str, stderr: str, exit_code: int
    ) -> dict[str, str]:
        """Mesh, steps and processes of the run, and its answer (a passing sample's is
        native's: the check requires it)."""
        facts = {"mesh": f"{self.case_size.cells}x{self.case_size.cells}"}
        log = parse_log(stdout)
        if log.procs is not None:
            facts["processes"] = str(log.procs)
        facts["steps"] = str(len(log.steps))
        if log.steps:
            facts["residuals"] = _residual_text(log.steps[-1].residuals)
        return facts

    def label(self, metric: str, np: int) -> str:
        short = next((m.short for m in METRICS if m.name == metric), metric)
        return f"{short}, np {np}"

    def resolution(self, metric: str) -> float | None:
        """The printing step of the solver's clock over the steps timed."""
        step = RESOLUTION.get(metric)
        return None if step is None else step / (self.case_size.steps - 1)

    def resolution_warning(self, metric: str, np: int, values: Sequence[float]) -> str | None:
        step = self.resolution(metric)
        if step is None:
            return None
        bigger = [s for s in SIZES if SIZES[s].steps > self.case_size.steps]
        advice = f"use --size {bigger[0]}" if bigger else "no larger --size exists"
        return resolution_warning(self.label(metric, np), values, step, "s", advice)


def _residual_text(residuals: Sequence[Any]) -> str:
    return ", ".join(f"{r.field} {r.initial:g}" for r in residuals)


def _build(options: SuiteOptions) -> list[Suite]:
    size = cast(OpenfoamSize, word_size(options, "openfoam_size"))
    return [OpenfoamSuite(size, bind=options.bind)]


KIND = SuiteKind(
    "openfoam",
    _build,
    "OpenFOAM's icoFoam on the cavity tutorial, decomposed over --np ranks, checked "
    "against native's residuals",
    metrics=METRICS,
    packages=PACKAGES,
    flags=FLAGS,
)
