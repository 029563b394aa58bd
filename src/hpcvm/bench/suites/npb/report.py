"""Reading what an NPB program printed: its result report, its verification, and, when
it failed, the real reason in its own words.

The report is NPB's ``print_results`` block after ``.. Benchmark Completed.``:
``Class``, ``Size``, ``Iterations``, ``Time in seconds``, ``Total processes``, 3.3's
``Compiled procs`` or 3.4's ``Active procs`` (3.4.1 and later: ``Active processes=``,
printed only when it differs), ``Mop/s total``, ``Verification`` and ``Version``.
Times and rates are printed with two decimals in 3.3 and 3.4 alike (Fortran ``f12.2``,
C ``%12.2f``).

A failed NPB run does not always fail visibly: a 3.3 CG built for 2 processes and
started on 1 prints a multi-line ``Error:`` and exits 0 (Fortran ``STOP``); 3.3 BT
prints ``WARNING: compiled for 4 processes`` and exits 0 without a report; 3.3 MG in
the same situation segfaults. The functions here turn each into one line that names
the cause (checked against real NPB 3.3.1 and 3.4 runs, see tests/data/npb/README.md).
"""

from __future__ import annotations

import re
import signal
from typing import Literal

from hpcvm.bench.core.metrics import ParseError, parse_number, tail
from hpcvm.model import Frozen

Verification = Literal["SUCCESSFUL", "UNSUCCESSFUL", "not performed"]

_COMPLETED = re.compile(r"^\s*(?P<name>[A-Z]{2}) Benchmark Completed\.?\s*$")
_FIELD = re.compile(r"^\s*(?P<key>[A-Za-z][A-Za-z/ ]*?)\s*=\s*(?P<value>.*?)\s*$")
# A line in which NPB reports an error: "ERROR: ...", "Error: ...", " *** ERROR ...",
# "Error encountered ..."; not CG's/MG's "Error is  0.1E-13" verification detail.
_ERROR = re.compile(r"^\s*(?:\*+\s*)?(?:ERROR|Error|error)\b(?!\s+is\b)")
_WARNING = re.compile(r"^\s*(?:\*+\s*)?WARNING\b")
_NOT_VERIFIED = re.compile(r"no verification (?:was )?performed", re.IGNORECASE)
_GFORTRAN_SIGNAL = re.compile(r"^Program received signal (?P<what>.*)$")
# Open MPI's own report of a rank killed by a signal.
_MPI_SIGNAL = re.compile(r"exited on signal (?P<number>\d+) \((?P<name>[^)]*)\)")
_MPI_TAG = re.compile(r"^\[[^\]\s]+:\d+\] ")  # "[host:pid] MCW rank 0 bound to ..."
_RULER = re.compile(r"^-{10,}$")
_BLOCK_LINES = 4


class NpbReport(Frozen):
    """The fields of one NPB result report."""

    benchmark: str  # "CG"
    klass: str  # "A"
    size: str  # "14000", "64x  64x  64"
    iterations: int
    time_s: float
    mops_total: float
    total_processes: int | None = None
    compiled_procs: int | None = None  # NPB 3.3
    active_processes: int | None = None  # NPB 3.4
    verification: str
    version: str | None = None


def has_report(stdout: str) -> bool:
    """Whether the program printed a result report at all."""
    return any(_COMPLETED.match(line) for line in stdout.splitlines())


def _report_fields(stdout: str) -> tuple[str, dict[str, str]]:
    lines = stdout.splitlines()
    starts = [(i, m["name"]) for i, line in enumerate(lines) if (m := _COMPLETED.match(line))]
    if not starts:
        raise ParseError(
            f"no NPB result report ('.. Benchmark Completed.'): {tail(stdout, 2) or 'no output'}"
        )
    start, name = starts[-1]
    fields: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if line.strip() == "Compile options:":
            break
        if match := _FIELD.match(line):
            fields.setdefault(match["key"], match["value"])
    return name, fields


def parse_report(stdout: str) -> NpbReport:
    """Read NPB's final report; ParseError if it is missing or a needed field is not
    there or not a number (Fortran prints ``****`` when a value overflows its field)."""
    name, fields = _report_fields(stdout)

    def need(key: str) -> str:
        if key not in fields:
            raise ParseError(f"NPB {name} report has no {key!r} line")
        return fields[key]

    def number(key: str) -> float:
        try:
            return parse_number(need(key))
        except ValueError as exc:
            raise ParseError(f"NPB {name}: {key} = {fields[key]!r} is not a number") from exc

    def optional_int(*keys: str) -> int | None:
        present = [key for key in keys if key in fields]
        return int(number(present[0])) if present else None

    return NpbReport(
        benchmark=name,
        klass=need("Class"),
        size=need("Size"),
        iterations=int(number("Iterations")),
        time_s=number("Time in seconds"),
        mops_total=number("Mop/s total"),
        total_processes=optional_int("Total processes"),
        compiled_procs=optional_int("Compiled procs"),
        active_processes=optional_int("Active procs", "Active processes"),
        verification=need("Verification"),
        version=fields.get("Version"),
    )


def verification(stdout: str) -> Verification | None:
    """What the program says of its verification; None when it printed no report and
    no verdict (it failed before verifying). The report's field says only SUCCESSFUL or
    UNSUCCESSFUL; a run whose problem size is not one of NPB's classes prints "NO
    VERIFICATION PERFORMED" (CG, MG) or "No verification performed" (BT, LU, SP)
    above an UNSUCCESSFUL report, and that is told apart here."""
    if _NOT_VERIFIED.search(stdout):
        return "not performed"
    try:
        _, fields = _report_fields(stdout)
    except ParseError:
        return None
    verdict = fields.get("Verification")
    if verdict == "SUCCESSFUL":
        return "SUCCESSFUL"
    if verdict == "UNSUCCESSFUL":
        return "UNSUCCESSFUL"
    return None


def error_lines(stdout: str) -> str | None:
    """NPB's own error message (the first one), its continuation lines joined: CG 3.3's
    ``Error:`` / ``num of procs allocated ( 1 )`` / ``is not equal to`` / ... becomes
    one sentence; ``Exiting program!`` is dropped."""
    lines = stdout.splitlines()
    for index, line in enumerate(lines):
        if not _ERROR.match(line):
            continue
        block: list[str] = []
        for part in lines[index : index + _BLOCK_LINES]:
            text = " ".join(part.split())
            if not text:
                break
            if text != "Exiting program!":
                block.append(text)
        return _join_sentence(block)
    return None


def _join_sentence(parts: list[str]) -> str:
    """Join a message's lines: a lower-case line or one after a colon continues the
    sentence; a capitalised line starts a new clause."""
    text = parts[0]
    for part in parts[1:]:
        glue = " " if text.endswith(":") or part[:1].islower() else "; "
        text = f"{text}{glue}{part}"
    return text.lstrip("* ").strip()


def warning_lines(stdout: str) -> list[str]:
    """NPB's warnings (``WARNING: compiled for 4 processes``), one line each."""
    return [" ".join(line.split()) for line in stdout.splitlines() if _WARNING.match(line)]


def program_stderr(stderr: str) -> str:
    """The program's own stderr: without Open MPI's help messages (framed by dashed
    rulers) and its ``[host:pid]``-tagged lines (``--report-bindings``)."""
    kept: list[str] = []
    inside = False
    for line in stderr.splitlines():
        if _RULER.match(line.strip()):
            inside = not inside
            continue
        if not inside and not _MPI_TAG.match(line):
            kept.append(line)
    return "\n".join(kept)


def _signal_reason(stderr: str, exit_code: int) -> str | None:
    if match := _MPI_SIGNAL.search(stderr):
        return f"a process was killed by signal {match['number']} ({match['name']})"
    if exit_code < 0:
        number = -exit_code
        try:
            name = signal.strsignal(number) or signal.Signals(number).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {number} ({name})"
    return None


def failure_reason(stdout: str, stderr: str, exit_code: int) -> str | None:
    """Why the run failed, in one line and in the program's own words where it gave
    any; None when nothing says it failed (the report is then read and checked).

    In order: NPB's own error line (however it exited), a signal (Open MPI's account,
    the compiler runtime's ``Program received signal ...`` and NPB's warnings, which
    usually say why), a non-zero exit with the end of the program's own stderr."""
    own = error_lines(stdout)
    if own:
        return own
    killed = _signal_reason(stderr, exit_code)
    program = program_stderr(stderr)
    if killed:
        runtime = [
            m["what"] for line in program.splitlines() if (m := _GFORTRAN_SIGNAL.match(line))
        ]
        detail = "; ".join(runtime[:1] + warning_lines(stdout))
        return f"{killed}: {detail}" if detail else killed
    if exit_code != 0:
        detail = tail(program, 2) or "; ".join(warning_lines(stdout)) or tail(stdout, 2)
        return f"exited with code {exit_code}: {detail or 'no output'}"
    return None


def no_report_reason(stdout: str) -> str:
    """Why a run that exited 0 has no report: its warnings and last line (3.3 BT built
    for 4 processes on 1: ``WARNING: compiled for 4 processes | Problem size too big
    for compiled array sizes``)."""
    last = [" ".join(line.split()) for line in stdout.splitlines() if line.strip()][-1:]
    said = list(dict.fromkeys([*warning_lines(stdout), *last]))
    return f"no NPB result report: {' | '.join(said) or 'no output'}"
