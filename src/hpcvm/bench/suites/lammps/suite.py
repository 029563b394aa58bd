"""LAMMPS on its Lennard-Jones benchmark: the molecular dynamics code people run, timed by
its own "Loop time", its final energy checked against native's.

What runs (Debian 12's ``lammps``, program ``lmp``, LAMMPS 29 Sep 2021 update 2): the
problem of LAMMPS's bench/in.lj, the atomic LJ fluid its benchmark page times: an fcc
lattice at reduced density 0.8442 melted from 1.44 (velocities seeded 87287, ``loop
geom``, so they do not depend on the process count), ``lj/cut`` at 2.5 sigma, neighbour
skin 0.3 rebuilt every 20 steps unchecked, NVE for 100 steps. Debian ships no bench
directory (lammps-examples has the smaller examples/melt, and is 145 MB), so hpcvm
writes that input into each sample's work directory; ``--size`` scales the box as the
benchmark's own ``-var x/y/z`` does:

======  =====================  ======  ===========================================
size    box (lattice cells)    atoms   loop time natively, np 2, 2-core host
======  =====================  ======  ===========================================
quick   5 x 5 x 5  (x = 0.25)  500     0.01-0.04 s (a TCG guest: 0.4-5 s)
small   10 x 10 x 10 (x = 0.5) 4000    0.5 s (load average 6)
medium  20 x 20 x 20 (x = 1)   32000   3.6 s (load average 6): the benchmark's own
======  =====================  ======  ===========================================

Metric: ``Loop time of T on P procs for S steps with A atoms``, the time LAMMPS spends
in the run's loop (set-up left out), printed to 6 digits; P, S and A must be the
sample's np, 100 and the size's atoms, or the sample fails.

The answer: the total energy (TotEng) of the last thermo row (step 100), compared with
the native reference run's at the same np (bench/suites/reference.py): same binary, same
processor grid, same arithmetic, so the same printed energy (native and a TCG guest
print the same digits). The tolerance, 1e-7 relative, is a few units in the last of the
8 digits LAMMPS prints. The energy itself moves by 2e-3 over these 100 steps (-4.6177
to -4.6259 at quick), and a melt started 0.01% hotter (1.4401) ends 3e-5 away: any
change of the physics is far outside the tolerance. LAMMPS's own ``ERROR`` line is a
failed sample's reason.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, cast

from hpcvm.bench.core.kind import SuiteKind, SuiteOptions, word_size
from hpcvm.bench.core.launch import Bind, find_program, in_workdir, mpirun_argv
from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError, tail
from hpcvm.bench.core.suite import Suite, check_np_values
from hpcvm.bench.suites.lammps import FLAGS
from hpcvm.bench.suites.reference import (
    read_run_file,
    reference_mpirun,
    relative_difference,
    run_step,
    write_run_file,
)
from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.model import Frozen

PROGRAM = "lmp"
PACKAGES = ("lammps", "openmpi-bin")
INPUT_FILE = "in.lj"
LOG_FILE = "log.lammps"
STEPS = 100
CELLS = 20  # lattice cells per side at scale 1 (the benchmark's 32,000 atoms)
ATOMS_PER_CELL = 4  # fcc
ENERGY_RTOL = 1e-7
REFERENCE_FILE = "hpcvm-reference.json"

LammpsSize = Literal["quick", "small", "medium"]
SCALES: dict[str, float] = {"quick": 0.25, "small": 0.5, "medium": 1.0}

# The problem of LAMMPS's bench/in.lj (module docstring), one command per line; the box
# is 20*x by 20*y by 20*z lattice cells, x, y and z given with -var as there.
_COMMANDS = (
    ("variable", "x index 1"),
    ("variable", "y index 1"),
    ("variable", "z index 1"),
    ("variable", "xx equal 20*$x"),
    ("variable", "yy equal 20*$y"),
    ("variable", "zz equal 20*$z"),
    ("units", "lj"),
    ("atom_style", "atomic"),
    ("lattice", "fcc 0.8442"),
    ("region", "box block 0 ${xx} 0 ${yy} 0 ${zz}"),
    ("create_box", "1 box"),
    ("create_atoms", "1 box"),
    ("mass", "1 1.0"),
    ("velocity", "all create 1.44 87287 loop geom"),
    ("pair_style", "lj/cut 2.5"),
    ("pair_coeff", "1 1 1.0 1.0 2.5"),
    ("neighbor", "0.3 bin"),
    ("neigh_modify", "delay 0 every 20 check no"),
    ("fix", "1 all nve"),
    ("run", str(STEPS)),
)
INPUT = "# 3d Lennard-Jones melt: the problem of LAMMPS's bench/in.lj\n" + "".join(
    f"{command:<14}{args}\n" for command, args in _COMMANDS
)

LOOP_TIME = Metric(
    name="loop_time",
    unit="s",
    higher_is_better=False,
    description=f"LAMMPS's Loop time of the {STEPS}-step LJ run",
    short="LAMMPS loop",
)
METRICS = (LOOP_TIME,)


def atoms(scale: float) -> int:
    """Atoms in the box at ``scale`` (4 per fcc cell)."""
    side = round(CELLS * scale)
    return ATOMS_PER_CELL * side**3


# --- the output ------------------------------------------------------------------------


class LammpsRun(Frozen):
    """What hpcvm reads from one LAMMPS run's screen output."""

    loop_time: float
    procs: int
    steps: int
    atoms: int
    total_energy: float
    last_step: int


_LOOP = re.compile(
    r"^Loop time of (\S+) on (\d+) procs for (\d+) steps with (\d+) atoms$", re.MULTILINE
)


def error_line(stdout: str, stderr: str) -> str:
    """LAMMPS's own ``ERROR`` (or ``ERROR on proc N``) line, without its source file."""
    for text in (stdout, stderr):
        for line in text.splitlines():
            if line.startswith("ERROR"):
                return re.sub(r"\s*\(src/[^)]*\)\s*$", "", line.strip())
    return ""


def _thermo_row(lines: list[str]) -> tuple[int, float]:
    """Step and TotEng of the last thermo row before the loop line."""
    header_at = max((i for i, line in enumerate(lines) if line.split()[:1] == ["Step"]), default=-1)
    if header_at < 0:
        raise ParseError("LAMMPS printed no thermo table (no 'Step ...' header)")
    columns = lines[header_at].split()
    if "TotEng" not in columns:
        raise ParseError(f"LAMMPS's thermo table has no TotEng column: {lines[header_at]}")
    rows = [line.split() for line in lines[header_at + 1 :]]
    rows = [r for r in rows if len(r) == len(columns) and r[0].isdigit()]
    if not rows:
        raise ParseError("LAMMPS's thermo table has no row")
    last = rows[-1]
    try:
        return int(last[0]), float(last[columns.index("TotEng")])
    except ValueError:
        raise ParseError(f"LAMMPS's last thermo row is no numbers: {' '.join(last)}") from None


def parse_output(stdout: str) -> LammpsRun:
    """The loop line and the final energy; ParseError when either is missing."""
    loops = list(_LOOP.finditer(stdout))
    if not loops:
        raise ParseError(f"LAMMPS printed no 'Loop time' line: {tail(stdout, 2) or 'no output'}")
    loop = loops[-1]
    step, energy = _thermo_row(stdout[: loop.start()].splitlines())
    try:
        seconds = float(loop[1])
    except ValueError:
        raise ParseError(f"LAMMPS's loop time {loop[1]!r} is not a number") from None
    return LammpsRun(
        loop_time=seconds,
        procs=int(loop[2]),
        steps=int(loop[3]),
        atoms=int(loop[4]),
        total_energy=energy,
        last_step=step,
    )


def energy_mismatch(found: float, reference: float) -> str | None:
    """Why ``found`` is not native's final energy within ENERGY_RTOL; None when it is."""
    if relative_difference(found, reference) <= ENERGY_RTOL:
        return None
    return (
        f"the final total energy is {found:.8g} where native's is {reference:.8g}, beyond "
        f"the {ENERGY_RTOL:g} relative tolerance"
    )


# --- the suite -------------------------------------------------------------------------


class LammpsSuite:
    """LAMMPS's LJ benchmark under mpirun, checked against native's final energy."""

    name = "lammps"
    uses_np = True
    metrics = METRICS
    output_files: tuple[str, ...] = ()  # the screen output is the log

    def __init__(self, size: str = "small", *, bind: Bind = "core") -> None:
        if size not in SCALES:
            raise UsageError(f"unknown lammps size {size!r}: use {', '.join(SCALES)}")
        self.size = size
        self.scale = SCALES[size]
        self.bind: Bind = bind
        self.references: dict[int, float] = {}

    @property
    def atoms(self) -> int:
        return atoms(self.scale)

    def program_argv(self) -> list[str]:
        """lmp on the input in the current directory, the box scaled, its log there."""
        scale = f"{self.scale:g}"
        return [
            find_program(PROGRAM, "lammps"), "-in", INPUT_FILE, "-var", "x", scale,
            "-var", "y", scale, "-var", "z", scale, "-log", LOG_FILE, "-nocite",
        ]  # fmt: skip

    def validate(self, np_values: Sequence[int]) -> None:
        check_np_values(self.name, np_values)
        self.program_argv()
        mpirun_argv(1, [PROGRAM], bind=self.bind)

    def prepare_inputs(self, directory: Path, np_values: Sequence[int]) -> None:
        """Native's final energy at each np, from one reference run each."""
        for np in dict.fromkeys(np_values):
            where = directory / f"np{np}"
            where.mkdir(parents=True, exist_ok=True)
            (where / INPUT_FILE).write_text(INPUT)
            argv = ["/usr/bin/env", "-C", str(where), *reference_mpirun(np, self.program_argv())]
            what = f"the native reference run of LAMMPS at np {np}"
            out = run_step(argv, log=where / "log.reference", what=what)
            run = parse_output(out)
            problem = self._check_run(run, np)
            if problem:
                raise BenchmarkError(f"lammps: the native reference run at np {np}: {problem}")
            self.references[np] = run.total_energy
            (where / REFERENCE_FILE).write_text(json.dumps({"total_energy": run.total_energy}))

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        if np not in self.references:
            raise BenchmarkError(
                f"lammps: no native reference for np {np} (prepare_inputs was not run for it)"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / INPUT_FILE).write_text(INPUT)
        (workdir / LOG_FILE).unlink(missing_ok=True)
        write_run_file(
            workdir,
            {"np": np, "size": self.size, "atoms": self.atoms, "reference": self.references[np]},
        )
        return in_workdir(workdir, mpirun_argv(np, self.program_argv(), bind=self.bind))

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        record = read_run_file(workdir, self.name)
        if exit_code != 0:
            said = error_line(stdout, stderr) or tail(stderr, 3) or tail(stdout, 3) or "-"
            raise ParseError(f"LAMMPS exited with code {exit_code}: {said}")
        run = parse_output(stdout)
        problem = self._check_run(run, int(record["np"]), int(record["atoms"]))
        if problem:
            raise ParseError(f"lammps: {problem}")
        mismatch = energy_mismatch(run.total_energy, float(record["reference"]))
        if mismatch:
            raise ParseError(f"lammps: the answer differs from native's: {mismatch}")
        return [LOOP_TIME.value(run.loop_time)]

    def _check_run(self, run: LammpsRun, np: int, expected_atoms: int | None = None) -> str | None:
        """Why the run is not the benchmark at np; None if it is."""
        expected_atoms = self.atoms if expected_atoms is None else expected_atoms
        if run.procs != np:
            return f"LAMMPS ran on {run.procs} procs where {np} were started"
        if run.steps != STEPS or run.last_step != STEPS:
            return f"LAMMPS ran {run.steps} steps (last thermo step {run.last_step}), not {STEPS}"
        if run.atoms != expected_atoms:
            return f"LAMMPS ran {run.atoms} atoms where --size {self.size} has {expected_atoms}"
        return None

    # -- DescribesSamples -----------------------------------------------------------------

    def sample_facts(
        self, workdir: Path, stdout: str, stderr: str, exit_code: int
    ) -> dict[str, str]:
        """Atoms, processes and the final energy (a passing sample's is native's)."""
        facts: dict[str, str] = {"atoms": str(self.atoms)}
        with contextlib.suppress(ParseError):
            run = parse_output(stdout)
            facts |= {"processes": str(run.procs), "total_energy": f"{run.total_energy:.8g}"}
        return facts

    def label(self, metric: str, np: int) -> str:
        return f"{LOOP_TIME.short}, np {np}"

    def resolution(self, metric: str) -> float | None:
        return None  # printed to 6 significant digits

    def resolution_warning(self, metric: str, np: int, values: Sequence[float]) -> str | None:
        return None


def _build(options: SuiteOptions) -> list[Suite]:
    size = cast(LammpsSize, word_size(options, "lammps_size"))
    return [LammpsSuite(size, bind=options.bind)]


KIND = SuiteKind(
    "lammps",
    _build,
    "LAMMPS's Lennard-Jones benchmark, checked against native's final energy",
    metrics=METRICS,
    packages=PACKAGES,
    flags=FLAGS,
)
