"""What icoFoam's log says: each time step's time, its linear solves' initial residuals,
and its CPU and wall time (``parse_log``), and the FOAM FATAL error a failed run printed
(``fatal_error``). Apart from the suite (suite.py), which turns steps into metrics and
checks the residuals against native's.
"""

from __future__ import annotations

import re

from hpcvm.bench.core.metrics import ParseError
from hpcvm.model import Frozen

SOLVER = "icoFoam"


class Residual(Frozen):
    """One linear solve: which field, and its initial residual."""

    field: str
    initial: float


class Step(Frozen):
    """One time step as the log shows it."""

    time: float
    residuals: tuple[Residual, ...]
    cpu: float  # ExecutionTime, s
    clock: float  # ClockTime, s


class SolverLog(Frozen):
    """What hpcvm reads from one icoFoam log."""

    build: str | None
    case: str | None
    procs: int | None
    steps: tuple[Step, ...]
    ended: bool


_TIME = re.compile(r"^Time = (\S+)$")
_SOLVE = re.compile(
    r"^\S+:\s+Solving for (\w+), Initial residual = (\S+), Final residual = \S+, "
    r"No Iterations \d+$"
)
_EXEC = re.compile(r"^ExecutionTime = (\S+) s\s+ClockTime = (\S+) s$")
_HEADER = re.compile(r"^(Build|Case|nProcs)\s*:\s*(.*)$")


def parse_log(text: str) -> SolverLog:
    """The time steps of an icoFoam log, each closed by its ExecutionTime line; a step
    cut off before that line is left out. ParseError for numbers that are none."""
    header: dict[str, str] = {}
    steps: list[Step] = []
    time: float | None = None
    residuals: list[Residual] = []
    ended = False
    try:
        for raw in text.splitlines():
            line = raw.strip()
            if (match := _HEADER.match(line)) and match[1] not in header:
                header[match[1]] = match[2].strip()
            elif match := _TIME.match(line):
                time, residuals = float(match[1]), []
            elif (match := _SOLVE.match(line)) and time is not None:
                residuals.append(Residual(field=match[1], initial=float(match[2])))
            elif (match := _EXEC.match(line)) and time is not None:
                steps.append(
                    Step(
                        time=time,
                        residuals=tuple(residuals),
                        cpu=float(match[1]),
                        clock=float(match[2]),
                    )
                )
                time = None
            elif line == "End":
                ended = True
    except ValueError as exc:
        raise ParseError(f"{SOLVER}'s log has a number that is none: {exc}") from None
    procs = header.get("nProcs")
    return SolverLog(
        build=header.get("Build"),
        case=header.get("Case"),
        procs=int(procs) if procs and procs.isdigit() else None,
        steps=tuple(steps),
        ended=ended,
    )


def fatal_error(stdout: str, stderr: str) -> str:
    """OpenFOAM's own reason for stopping: the lines after ``FOAM FATAL (IO) ERROR``
    (rank prefixes removed) up to its "From function"; "" when it gave none."""
    for text in (stderr, stdout):
        lines = [re.sub(r"^\[\d+\]\s?", "", line).strip() for line in text.splitlines()]
        for i, line in enumerate(lines):
            if "FOAM FATAL" in line:
                said: list[str] = []
                for after in lines[i + 1 :]:
                    if after.startswith(("From function", "FOAM ", "file:")) or (
                        not after and said
                    ):
                        break
                    if after:
                        said.append(after)
                return " ".join(said[:3]) or line
    return ""
