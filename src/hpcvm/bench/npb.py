"""NAS Parallel Benchmarks (MPI versions) from a directory of binaries the user built.

NPB is not packaged by Debian, so the user points at a ``bin`` directory
(``--npb-dir``). Binary names follow NPB's make: ``<kernel>.<class>.<procs>`` in 3.3,
where the process count is compiled in (``cg.A.4``), and ``<kernel>.<class>.x`` in 3.4,
where it is chosen at run time. One suite per kernel and class (``npb:cg.A``); for each
np it runs the 3.4 binary or the 3.3 binary built for that np.

The report every kernel prints at the end (NPB's ``print_results``) is read from stdout:
``Class``, ``Size``, ``Iterations``, ``Time in seconds``, ``Total processes``, 3.3's
``Compiled procs`` or 3.4's ``Active processes``, ``Mop/s total``, ``Verification``
(``SUCCESSFUL``, ``UNSUCCESSFUL``; anything but SUCCESSFUL is a failed sample).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from hpcvm.bench.launch import Bind, in_workdir, mpirun_argv
from hpcvm.bench.metrics import Metric, MetricValue, ParseError, parse_number, tail
from hpcvm.bench.suite import check_np_values, require_exit_ok
from hpcvm.errors import UsageError
from hpcvm.model import Frozen

# dt is left out: it needs a graph argument (BH, WH, SH) and reports no Mop/s.
KERNELS = ("bt", "cg", "ep", "ft", "is", "lu", "mg", "sp")
_BINARY = re.compile(r"^(?P<kernel>[a-z]{2})\.(?P<klass>[SWABCDEF])\.(?P<procs>x|[0-9]+)$")
_COMPLETED = re.compile(r"^\s*(?P<name>[A-Z]{2}) Benchmark Completed\.?\s*$")
_FIELD = re.compile(r"^\s*(?P<key>[A-Za-z][A-Za-z/ ]*?)\s*=\s*(?P<value>.*?)\s*$")

TIME = Metric(name="Time_sec", unit="s", higher_is_better=False, description="NPB timed section")
MOPS = Metric(
    name="Mops_total",
    unit="Mop/s",
    higher_is_better=True,
    description="NPB rate, all processes",
)
METRICS = (TIME, MOPS)


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

    def optional_int(key: str) -> int | None:
        return int(number(key)) if key in fields else None

    return NpbReport(
        benchmark=name,
        klass=need("Class"),
        size=need("Size"),
        iterations=int(number("Iterations")),
        time_s=number("Time in seconds"),
        mops_total=number("Mop/s total"),
        total_processes=optional_int("Total processes"),
        compiled_procs=optional_int("Compiled procs"),
        active_processes=optional_int("Active processes"),
        verification=need("Verification"),
        version=fields.get("Version"),
    )


def report_metrics(report: NpbReport) -> list[MetricValue]:
    """Time and Mop/s of a verified run; ParseError for any other verification."""
    if report.verification != "SUCCESSFUL":
        raise ParseError(
            f"NPB {report.benchmark} class {report.klass}: verification {report.verification}"
        )
    return [TIME.value(report.time_s), MOPS.value(report.mops_total)]


class NpbSuite:
    """One NPB kernel and class, run under mpirun from the user's binaries."""

    uses_np = True
    metrics = METRICS
    output_files: tuple[str, ...] = ()  # the report is on stdout

    def __init__(self, kernel: str, klass: str, binaries: dict[str, Path], *, bind: Bind = "core"):
        if not binaries:
            raise UsageError(f"npb: no binaries for {kernel}.{klass}")
        self.kernel = kernel
        self.klass = klass
        self.binaries = dict(binaries)  # "x" or the compiled-in process count -> path
        self.bind: Bind = bind

    @property
    def name(self) -> str:
        return f"npb:{self.kernel}.{self.klass}"

    def binary_for(self, np: int) -> Path:
        """The 3.4 binary (any np) if present, else the 3.3 binary built for ``np``."""
        found = self.binaries.get("x") or self.binaries.get(str(np))
        if found is None:
            have = ", ".join(sorted(p.name for p in self.binaries.values()))
            raise UsageError(
                f"{self.name}: no binary for np={np} (have {have}): build "
                f"{self.kernel}.{self.klass}.{np} (NPB 3.3) or {self.kernel}.{self.klass}.x (3.4)"
            )
        return found

    def validate(self, np_values: Sequence[int]) -> None:
        check_np_values(self.name, np_values)
        for np in np_values:
            self.binary_for(np)
        mpirun_argv(1, ["npb"], bind=self.bind)

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        return in_workdir(workdir, mpirun_argv(np, [str(self.binary_for(np))], bind=self.bind))

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        require_exit_ok(f"NPB {self.kernel}.{self.klass}", exit_code, stdout, stderr)
        report = parse_report(stdout)
        if report.benchmark.lower() != self.kernel or report.klass != self.klass:
            raise ParseError(
                f"{self.name}: the binary reports {report.benchmark} class {report.klass}"
            )
        return report_metrics(report)


def _selected(kernels: Sequence[str] | None, kernel: str, klass: str) -> bool:
    if not kernels:
        return True
    return any(k.lower() in (kernel, f"{kernel}.{klass}".lower()) for k in kernels)


def discover(
    npb_dir: Path, kernels: Sequence[str] | None = None, *, bind: Bind = "core"
) -> list[NpbSuite]:
    """One suite per kernel.class found in ``npb_dir`` (only those in ``kernels``,
    given as ``cg`` or ``cg.A``, if any). UsageError before anything starts when the
    directory is missing, holds no NPB binary, or lacks a requested kernel."""
    if not npb_dir.is_dir():
        raise UsageError(f"NPB directory {npb_dir} does not exist: pass NPB's bin directory")
    found: dict[tuple[str, str], dict[str, Path]] = {}
    for path in sorted(npb_dir.iterdir()):
        match = _BINARY.match(path.name)
        if not match or match["kernel"] not in KERNELS:
            continue
        if path.is_file() and os.access(path, os.X_OK):
            key = (match["kernel"], match["klass"])
            found.setdefault(key, {})[match["procs"]] = path.absolute()
    if not found:
        raise UsageError(f"no NPB binaries (named like cg.A.x or cg.A.4, executable) in {npb_dir}")
    for wanted in kernels or ():
        if not any(_selected([wanted], kernel, klass) for kernel, klass in found):
            have = ", ".join(f"{k}.{c}" for k, c in sorted(found))
            raise UsageError(f"NPB kernel {wanted!r} not in {npb_dir} (have {have})")
    return [
        NpbSuite(kernel, klass, binaries, bind=bind)
        for (kernel, klass), binaries in sorted(found.items())
        if _selected(kernels, kernel, klass)
    ]
