"""NAS Parallel Benchmarks (MPI versions) from a directory of binaries the user built.

NPB is not packaged by Debian, so the user points at a ``bin`` directory
(``--npb-dir``). Binary names follow NPB's make: ``<kernel>.<class>.<procs>`` in 3.3,
where the process count is compiled in (``cg.A.4``), and ``<kernel>.<class>.x`` in 3.4,
where it is chosen at run time. One suite per kernel and class (``npb:cg.A``); for each
np it runs the 3.4 binary or the 3.3 binary built for that np.

Which class runs: a plain kernel name (``cg``) runs the one class ``--size`` picks
(quick S, small W, medium A: see :mod:`hpcvm.bench.suites.npb.kernels`), ``cg.B`` names one;
no kernel list runs every kernel found in the size's class. A binary's name is only a
claim: the report says which kernel, class and process count really ran, and a
mismatch is a failed sample, as is any run NPB did not verify (see
:mod:`hpcvm.bench.suites.npb.report` for how a failure's reason is found).

Beyond the :class:`~hpcvm.bench.core.suite.Suite` protocol a suite here offers, as data for
tables and reports: ``sample_facts`` (verification, class, process counts of one run,
failed or not), ``label`` ("CG time, np 1"), ``resolution`` (the printing step of a
metric) and ``resolution_warning``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcvm.bench.core.kind import SuiteKind, SuiteOptions, size_fraction
from hpcvm.bench.core.launch import Bind, in_workdir, mpirun_argv
from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError
from hpcvm.bench.core.resolution import resolution_warning
from hpcvm.bench.core.suite import Suite, check_np_values
from hpcvm.bench.suites.npb import FLAGS
from hpcvm.bench.suites.npb.kernels import (
    CLASS_BY_SIZE,
    CLASSES,
    KERNELS,
    check_process_count,
    class_for_size,
    larger_class,
    parse_selector,
)
from hpcvm.bench.suites.npb.report import (
    NpbReport,
    failure_reason,
    has_report,
    no_report_reason,
    parse_report,
    verification,
)
from hpcvm.errors import UsageError
from hpcvm.model import Frozen

__all__ = [
    "METRICS",
    "MOPS",
    "TIME",
    "NpbReport",
    "NpbSuite",
    "discover",
    "parse_report",
    "report_metrics",
    "sample_facts",
]

_BINARY = re.compile(r"^(?P<kernel>[a-z]{2})\.(?P<klass>[SWABCDEF])\.(?P<procs>x|[0-9]+)$")

TIME = Metric(name="Time_sec", unit="s", higher_is_better=False, description="NPB timed section")
MOPS = Metric(
    name="Mops_total",
    unit="Mop/s",
    higher_is_better=True,
    description="NPB rate, all processes",
)
METRICS = (TIME, MOPS)

# What each metric is called in a label, and the step NPB prints it in (f12.2 in
# Fortran, %12.2f in C, in 3.3 and 3.4 alike).
LABELS = {TIME.name: "time", MOPS.name: "Mop/s"}
RESOLUTION = {TIME.name: 0.01, MOPS.name: 0.01}

# Written by prepare into the run's directory, read back by parse: the process count
# and binary of this very run, which the report is checked against.
RUN_FILE = "hpcvm-npb-run.json"


def report_metrics(report: NpbReport) -> list[MetricValue]:
    """Time and Mop/s of a verified run; ParseError for any other verification."""
    if report.verification != "SUCCESSFUL":
        raise ParseError(
            f"NPB {report.benchmark} class {report.klass}: verification {report.verification}"
        )
    return [TIME.value(report.time_s), MOPS.value(report.mops_total)]


def sample_facts(stdout: str) -> dict[str, str]:
    """What one run's output says about the run, failed or not, as strings to store
    beside the sample: ``verification`` (SUCCESSFUL, UNSUCCESSFUL, not performed),
    ``class``, ``processes``, ``active_processes`` (3.4), ``compiled_processes`` (3.3),
    ``npb_version``. Keys whose value the output does not give are left out."""
    facts: dict[str, str] = {}
    verdict = verification(stdout)
    if verdict is not None:
        facts["verification"] = verdict
    try:
        report = parse_report(stdout)
    except ParseError:
        return facts
    facts["class"] = report.klass
    optional = {
        "processes": report.total_processes,
        "active_processes": report.active_processes,
        "compiled_processes": report.compiled_procs,
        "npb_version": report.version,
    }
    facts.update({key: str(value) for key, value in optional.items() if value is not None})
    return facts


class NpbSuite:
    """One NPB kernel and class, run under mpirun from the user's binaries."""

    uses_np = True
    metrics = METRICS
    output_files: tuple[str, ...] = ()  # the report is on stdout

    def __init__(self, kernel: str, klass: str, binaries: dict[str, Path], *, bind: Bind = "core"):
        if kernel not in KERNELS or klass not in CLASSES:
            raise UsageError(f"npb: {kernel}.{klass} is no NPB kernel and class hpcvm runs")
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
            try:
                check_process_count(self.kernel, np)
            except UsageError as exc:
                raise UsageError(f"{self.name}: {exc}") from None
            self.binary_for(np)
        mpirun_argv(1, ["npb"], bind=self.bind)

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        binary = self.binary_for(np)
        (workdir / RUN_FILE).write_text(json.dumps({"np": np, "binary": str(binary)}))
        return in_workdir(workdir, mpirun_argv(np, [str(binary)], bind=self.bind))

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        reason = failure_reason(stdout, stderr, exit_code)
        if reason:
            raise ParseError(f"{self.name}: {reason}")
        if not has_report(stdout):
            raise ParseError(f"{self.name}: {no_report_reason(stdout)}")
        try:
            report = parse_report(stdout)
        except ParseError as exc:
            raise ParseError(f"{self.name}: {exc}") from None
        verdict = verification(stdout)
        if verdict != "not performed":  # else the class is U: say why, not "class U"
            self._check_report(report, _recorded_run(workdir))
        if verdict != "SUCCESSFUL":
            raise ParseError(f"{self.name}: {_VERDICTS.get(verdict or '', 'no verification')}")
        return [TIME.value(report.time_s), MOPS.value(report.mops_total)]

    def _check_report(self, report: NpbReport, run: tuple[int, str] | None) -> None:
        """The report must be of this kernel and class, on all the processes started."""
        binary = run[1] if run else ", ".join(sorted(p.name for p in self.binaries.values()))
        if report.benchmark.lower() != self.kernel or report.klass != self.klass:
            raise ParseError(
                f"{self.name}: the binary {binary} reports {report.benchmark} class "
                f"{report.klass}: rename it or rebuild it (make {self.kernel} CLASS={self.klass})"
            )
        np = run[0] if run else None
        compiled, total, active = (
            report.compiled_procs,
            report.total_processes,
            report.active_processes,
        )
        if np is not None and compiled is not None and compiled != np:
            raise ParseError(
                f"{self.name}: the binary {binary} was compiled for {_processes(compiled)} "
                f"(NPB 3.3), not {np}: rename it {self.kernel}.{self.klass}.{compiled} or "
                f"rebuild it (make {self.kernel} CLASS={self.klass} NPROCS={np})"
            )
        if np is not None and total is not None and total != np:
            raise ParseError(
                f"{self.name}: NPB counted {total} processes where mpirun started {np}: "
                f"the binary was built with another MPI than Open MPI (rebuild with "
                f"Open MPI's mpif90 and mpicc)"
            )
        if total is not None and active is not None and active != total:
            raise ParseError(
                f"{self.name}: only {active} of {total} processes worked (NPB "
                f"{self.kernel.upper()} needs a {KERNELS[self.kernel][1]} number of processes)"
            )

    def sample_facts(
        self, workdir: Path, stdout: str, stderr: str, exit_code: int
    ) -> dict[str, str]:
        """:func:`sample_facts` of this run's output, with the binary that ran."""
        facts = sample_facts(stdout)
        run = _recorded_run(workdir)
        if run:
            facts["binary"] = Path(run[1]).name
        return facts

    def label(self, metric: str, np: int) -> str:
        """Short name of a metric of this suite at ``np``: "CG time, np 1"."""
        return f"{self.kernel.upper()} {LABELS.get(metric, metric)}, np {np}"

    def resolution(self, metric: str) -> float | None:
        """The step in which NPB prints ``metric`` (in its unit); None if unknown."""
        return RESOLUTION.get(metric)

    def resolution_warning(self, metric: str, np: int, values: Sequence[float]) -> str | None:
        """One line when ``metric``'s printing step is coarser than 1% of the mean of
        ``values``, saying what to do in ``bench``'s own options; None otherwise."""
        step = RESOLUTION.get(metric)
        unit = next((m.unit for m in METRICS if m.name == metric), "")
        if step is None:
            return None
        return resolution_warning(self.label(metric, np), values, step, unit, self._advice(metric))

    def _advice(self, metric: str) -> str:
        bigger = larger_class(self.klass)
        if bigger is None:
            return "no larger NPB class exists"
        sizes = [size for size, klass in CLASS_BY_SIZE.items() if klass == bigger]
        how = (
            f"--size {sizes[0]}, or --npb-kernels {self.kernel}.{bigger}"
            if sizes
            else (f"--npb-kernels {self.kernel}.{bigger}")
        )
        advice = f"run a larger class ({how})"
        if metric == TIME.name:
            advice += (
                f", or compare {self.kernel.upper()} Mop/s, which NPB computes from the "
                "unrounded time"
            )
        return advice


_VERDICTS = {
    "UNSUCCESSFUL": (
        "verification UNSUCCESSFUL: NPB found the result wrong (a miscompiled binary, or a "
        "fault in this environment); its time means nothing"
    ),
    "not performed": (
        "verification not performed: the problem is none of NPB's classes, so NPB could not "
        "check the result"
    ),
}


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def _recorded_run(workdir: Path) -> tuple[int, str] | None:
    """np and binary that ``prepare`` recorded for this run; None when parse is called
    without a prepared directory (then the process count is not checked)."""
    try:
        data = json.loads((workdir / RUN_FILE).read_text())
        return int(data["np"]), str(data["binary"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _scan(npb_dir: Path) -> dict[tuple[str, str], dict[str, Path]]:
    """Executable NPB binaries in ``npb_dir`` by (kernel, class) of the kernels hpcvm runs."""
    found: dict[tuple[str, str], dict[str, Path]] = {}
    for path in sorted(npb_dir.iterdir()):
        match = _BINARY.match(path.name)
        if not match or match["kernel"] not in KERNELS:
            continue
        if path.is_file() and os.access(path, os.X_OK):
            key = (match["kernel"], match["klass"])
            found.setdefault(key, {})[match["procs"]] = path.absolute()
    return found


def _missing(npb_dir: Path, kernel: str, klass: str, why: str, have: list[str]) -> UsageError:
    others = [name for name in have if name.startswith(f"{kernel}.")]
    named = f"; or name a class you have: --npb-kernels {others[0]}" if others else ""
    return UsageError(
        f"no NPB {kernel}.{klass} binary in {npb_dir} ({why}; have "
        f"{', '.join(have)}): build it (make {kernel} CLASS={klass}){named}"
    )


def discover(
    npb_dir: Path,
    kernels: Sequence[str] | None = None,
    *,
    size: str | float = "small",
    bind: Bind = "core",
) -> list[NpbSuite]:
    """The suites to run from ``npb_dir``: one per ``kernels`` entry (``cg`` in the
    class ``size`` picks, ``cg.A`` as named), or without entries every kernel found in
    the class ``size`` picks. UsageError before anything starts when the directory is
    missing, holds no NPB binary, or lacks a requested kernel and class, or when a
    kernel is unknown or one hpcvm does not run (dt, with the reason)."""
    if not npb_dir.is_dir():
        raise UsageError(f"NPB directory {npb_dir} does not exist: pass NPB's bin directory")
    selectors = [parse_selector(text) for text in kernels or ()]
    found = _scan(npb_dir)
    if not found:
        raise UsageError(f"no NPB binaries (named like cg.A.x or cg.A.4, executable) in {npb_dir}")
    have = [f"{k}.{c}" for k, c in sorted(found)]
    wanted: list[tuple[str, str]] = []
    for kernel, named in selectors:
        klass = named or class_for_size(size)
        if (kernel, klass) not in found:
            why = f"asked for {kernel}.{klass}" if named else f"--size {size} runs class {klass}"
            raise _missing(npb_dir, kernel, klass, why, have)
        wanted.append((kernel, klass))
    if not selectors:
        klass = class_for_size(size)
        wanted = [key for key in sorted(found) if key[1] == klass]
        if not wanted:
            raise UsageError(
                f"no class {klass} NPB binaries in {npb_dir} (--size {size} runs class "
                f"{klass}; have {', '.join(have)}): name what to run (--npb-kernels "
                f"{have[0]}) or build class {klass}"
            )
    return [
        NpbSuite(kernel, klass, found[(kernel, klass)], bind=bind)
        for kernel, klass in dict.fromkeys(wanted)
    ]


class NpbOptions(Frozen):
    """npb's options (FLAGS) and its reading of ``--size`` (a class per kernel)."""

    bind: Bind = "core"
    size: str = "small"
    npb_dir: Path | None = None
    npb_kernels: tuple[str, ...] = ()
    npb_size: str | float | None = None  # set outright (tests, a run recorded so)


def _build(options: SuiteOptions) -> list[Suite]:
    o = options.typed(NpbOptions)
    if o.npb_dir is None:
        raise UsageError("--suite npb needs --npb-dir DIR (the bin directory of your NPB build)")
    size = o.npb_size if o.npb_size is not None else size_fraction(o.size)
    return list(discover(o.npb_dir, o.npb_kernels, size=size, bind=o.bind))


def _settle(values: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """The directory as an absolute path (read from where the user was), the kernels as
    a list."""
    settled = dict(values)
    if values.get("npb_dir"):
        settled["npb_dir"] = str(cwd / values["npb_dir"])
    if isinstance(values.get("npb_kernels"), str):
        settled["npb_kernels"] = [k for k in values["npb_kernels"].split(",") if k]
    return settled


def _guest_dirs(options: SuiteOptions) -> list[Path]:
    npb_dir = options.typed(NpbOptions).npb_dir
    return [] if npb_dir is None else [npb_dir]


def _label(suite: str, metric: str) -> str | None:
    """What an NPB figure shows: "CG time", "CG Mop/s"."""
    word = LABELS.get(metric)
    if word is None:
        return None
    return f"{suite.removeprefix('npb:').split('.')[0].upper()} {word}"


def _np_label(suite: str, metric: str, np: int) -> str | None:
    name = _label(suite, metric)
    return None if name is None else f"{name}, np {np}"


KIND = SuiteKind(
    "npb",
    _build,
    "your NAS Parallel Benchmarks MPI binaries (--npb-dir), one class per kernel",
    metrics=METRICS,
    packages=("openmpi-bin",),
    flags=FLAGS,
    guest_dirs=_guest_dirs,
    settle=_settle,
    owns=lambda suite: suite.startswith("npb:"),
    label=_label,
    np_label=_np_label,
)
