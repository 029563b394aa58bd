"""HPC Challenge (the distribution's ``hpcc``): its input file, its run, its summary.

Input: ``hpccinf.txt`` is HPL.dat (lines 1-31) with one problem size N, one block size
NB and one P x Q process grid, a separator line 32, then the PTRANS lines 33-36. hpcc
sizes every other test from N (STREAM and RandomAccess use about as much memory per
process as the HPL matrix, PTRANS uses two N/2 matrices), so N alone sets the memory
footprint: 8*N^2 bytes over all processes. hpcc reads each line into an 82-byte buffer,
so every line stays under 80 characters.

Output: hpcc appends to ``hpccoutf.txt`` in its working directory; its summary lies
between ``Begin of Summary section.`` and ``End of Summary section.`` as KEY=VALUE lines
printed with %g. ``Success=0`` means some test failed its own check (HPL residual,
PTRANS residual, RandomAccess errors, STREAM validation, DGEMM or FFT error): the run is
a failed sample. Values hpcc did not measure are -1 (ping-pong and ring need two
processes, so at np=1 they are -1 and are left out rather than failed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from hpcvm.bench.core.kind import SuiteKind, SuiteOptions, size_fraction
from hpcvm.bench.core.launch import Bind, find_program, in_workdir, mpirun_argv
from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError, parse_number, tail
from hpcvm.bench.core.suite import Suite, check_np_values, require_exit_ok
from hpcvm.bench.suites.hpcc import FLAGS
from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.model import Frozen
from hpcvm.units import MIB, human_size

INPUT_FILE = "hpccinf.txt"
OUTPUT_FILE = "hpccoutf.txt"
SUMMARY_BEGIN = "Begin of Summary section."
SUMMARY_END = "End of Summary section."

HpccSize = Literal["small", "medium"] | float

# Matrix bytes per process of the presets: "small" gives N of about 1000 at np=1 and a
# run of about a second natively (quick sizes for tests and TCG guests); "medium" is
# 8x larger. A float is the fraction of the environment's memory the matrix may take.
PRESET_BYTES_PER_PROCESS = {"small": 8 * MIB, "medium": 64 * MIB}
# hpcc's own default sizing uses 80% of memory; more leaves no room for the guest
# kernel, the tmpfs overlay and the MPI buffers.
MAX_MEMORY_FRACTION = 0.8
PACKAGE = "hpcc"  # Debian's HPC Challenge
SMALL_NB, LARGE_NB = 80, 192
LARGE_NB_FROM_N = 8000  # larger blocks pay off only once the matrix is large
# A warm-up's matrix is this fraction of a sample's (module doc of bench/run/runner.py: the
# same program, code paths and libraries, an eighth of the memory).
WARMUP_MATRIX_SHARE = 8
# What such a warm-up costs as a share of a sample, measured at --size quick on a 2-core
# Xeon: 0.16 s against 0.64 s natively, 2.9-3.6 s against 9.4-9.8 s in a TCG guest
# (mpirun's start and, in a guest, the agent's round trip do not shrink with the matrix).
WARMUP_COST_SHARE = 0.3


def _metric(
    name: str, unit: str, higher: bool, description: str, short: str, *, memory: bool = False
) -> Metric:
    return Metric(
        name=name,
        unit=unit,
        higher_is_better=higher,
        description=description,
        short=short,
        memory_bound=memory,
    )


METRICS: tuple[Metric, ...] = (
    _metric("HPL_Tflops", "Tflop/s", True, "HPL: dense LU solve rate", "HPL"),
    _metric("StarDGEMM_Gflops", "Gflop/s", True, "DGEMM on every process at once (mean)", "DGEMM"),
    _metric("SingleDGEMM_Gflops", "Gflop/s", True, "DGEMM on one process alone", "DGEMM single"),
    _metric(
        "StarSTREAM_Triad",
        "GB/s",
        True,
        "STREAM triad on every process (mean)",
        "STREAM",
        memory=True,
    ),
    _metric(
        "SingleSTREAM_Triad",
        "GB/s",
        True,
        "STREAM triad on one process alone",
        "STREAM single",
        memory=True,
    ),
    _metric(
        "StarRandomAccess_GUPs",
        "GUP/s",
        True,
        "RandomAccess on every process (mean)",
        "RA",
        memory=True,
    ),
    _metric(
        "SingleRandomAccess_GUPs",
        "GUP/s",
        True,
        "RandomAccess on one process alone",
        "RA single",
        memory=True,
    ),
    _metric(
        "MPIRandomAccess_GUPs",
        "GUP/s",
        True,
        "RandomAccess over MPI, whole job",
        "RA MPI",
        memory=True,
    ),
    _metric("PTRANS_GBs", "GB/s", True, "parallel matrix transpose", "PTRANS"),
    _metric("MPIFFT_Gflops", "Gflop/s", True, "FFT over MPI, whole job", "FFT MPI"),
    _metric("StarFFT_Gflops", "Gflop/s", True, "FFT on every process (mean)", "FFT"),
    _metric("SingleFFT_Gflops", "Gflop/s", True, "FFT on one process alone", "FFT single"),
)

# Ping-pong and ring figures: hpcc measures them only with two or more processes.
COMMUNICATION_METRICS: tuple[Metric, ...] = (
    _metric(
        "MaxPingPongLatency_usec",
        "us",
        False,
        "worst ping-pong latency of all pairs",
        "PingPong lat max",
    ),
    _metric("AvgPingPongLatency_usec", "us", False, "mean ping-pong latency", "PingPong lat"),
    _metric(
        "MinPingPongBandwidth_GBytes", "GB/s", True, "worst ping-pong bandwidth", "PingPong bw"
    ),
    _metric(
        "NaturallyOrderedRingLatency_usec", "us", False, "ring latency, rank order", "Ring lat"
    ),
    _metric(
        "RandomlyOrderedRingLatency_usec",
        "us",
        False,
        "ring latency, random order",
        "Ring lat rand",
    ),
    _metric(
        "NaturallyOrderedRingBandwidth_GBytes",
        "GB/s",
        True,
        "ring bandwidth, rank order",
        "Ring bw",
    ),
    _metric(
        "RandomlyOrderedRingBandwidth_GBytes",
        "GB/s",
        True,
        "ring bandwidth, random order",
        "Ring bw rand",
    ),
)


# --- input --------------------------------------------------------------------------


def process_grid(np: int) -> tuple[int, int]:
    """P x Q = np with P <= Q and P as large as possible (the squarest grid): HPL
    communicates least on a square grid, and P <= Q is HPL's recommended orientation."""
    if np < 1:
        raise UsageError(f"hpcc: process count must be at least 1, got {np}")
    p = math.isqrt(np)
    while np % p:
        p -= 1
    return p, np // p


def problem_size(matrix_bytes: int, nb: int) -> int:
    """Largest N whose 8*N^2-byte matrix fits ``matrix_bytes``, rounded down to a multiple
    of 2*NB so that both HPL (N) and PTRANS (N/2) split evenly into NB blocks."""
    step = 2 * nb
    return (math.isqrt(matrix_bytes // 8) // step) * step


def block_size(matrix_bytes: int) -> int:
    """NB: small blocks for small matrices (less padding, better balance), larger ones
    once the matrix is large enough for BLAS-3 efficiency to dominate."""
    return LARGE_NB if math.isqrt(matrix_bytes // 8) >= LARGE_NB_FROM_N else SMALL_NB


class HpccInput(Frozen):
    """The parameters of one hpccinf.txt (one N, one NB, one grid; HPL's usual tuning
    for the rest, as in hpcc's example file)."""

    n: int
    nb: int
    p: int
    q: int
    pmap: int = 0  # 0 = row-major process mapping
    threshold: float = 16.0
    pfact: int = 2  # right-looking
    nbmin: int = 4
    ndiv: int = 2
    rfact: int = 1  # Crout
    bcast: int = 1  # 1rM
    depth: int = 1
    swap: int = 2  # mix
    swap_threshold: int = 64
    l1_form: int = 0
    u_form: int = 0
    equilibration: int = 1
    alignment: int = 8

    @property
    def matrix_bytes(self) -> int:
        return 8 * self.n * self.n

    def render(self) -> str:
        """The file's text: 31 HPL lines, the separator line 32, the PTRANS lines 33-36.

        No additional PTRANS sizes or blocks (lines 33 and 35 are 0): hpcc adds N/2 and
        NB from the HPL lines itself, which is the size PTRANS is meant to have.
        """
        rows: list[tuple[object, str]] = [
            (1, "# of problems sizes (N)"),
            (self.n, "Ns"),
            (1, "# of NBs"),
            (self.nb, "NBs"),
            (self.pmap, "PMAP process mapping (0=Row-,1=Column-major)"),
            (1, "# of process grids (P x Q)"),
            (self.p, "Ps"),
            (self.q, "Qs"),
            (self.threshold, "threshold"),
            (1, "# of panel fact"),
            (self.pfact, "PFACTs (0=left, 1=Crout, 2=Right)"),
            (1, "# of recursive stopping criterium"),
            (self.nbmin, "NBMINs (>= 1)"),
            (1, "# of panels in recursion"),
            (self.ndiv, "NDIVs"),
            (1, "# of recursive panel fact."),
            (self.rfact, "RFACTs (0=left, 1=Crout, 2=Right)"),
            (1, "# of broadcast"),
            (self.bcast, "BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)"),
            (1, "# of lookahead depth"),
            (self.depth, "DEPTHs (>=0)"),
            (self.swap, "SWAP (0=bin-exch,1=long,2=mix)"),
            (self.swap_threshold, "swapping threshold"),
            (self.l1_form, "L1 in (0=transposed,1=no-transposed) form"),
            (self.u_form, "U  in (0=transposed,1=no-transposed) form"),
            (self.equilibration, "Equilibration (0=no,1=yes)"),
            (self.alignment, "memory alignment in double (> 0)"),
        ]
        lines = [
            "HPLinpack benchmark input file (written by hpcvm)",
            "Innovative Computing Laboratory, University of Tennessee",
            "HPL.out      output file name (if any; hpcc ignores it)",
            "8            device out (6=stdout,7=stderr,file; hpcc ignores it)",
            *(f"{value!s:<13}{text}" for value, text in rows),
            "##### This line (no. 32) is ignored (it serves as a separator). ######",
            f"{0!s:<13}Number of additional problem sizes for PTRANS",
            f"{self.n // 2!s:<13}values of N (unused: hpcc adds N/2 itself)",
            f"{0!s:<13}number of additional blocking sizes for PTRANS",
            f"{self.nb!s:<13}values of NB (unused: hpcc adds NB itself)",
        ]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> HpccInput:
        """Read an hpccinf.txt back by line position, as hpcc does (checks the layout)."""
        lines = text.splitlines()
        if len(lines) < 36:
            raise ValueError(f"hpccinf.txt has {len(lines)} lines, expected 36")
        too_long = [i + 1 for i, line in enumerate(lines) if len(line) > 80]
        if too_long:
            raise ValueError(f"lines longer than 80 characters: {too_long}")

        def first(line_no: int) -> str:
            return lines[line_no - 1].split()[0]

        def integer(line_no: int) -> int:
            return int(first(line_no))

        for count_line in (5, 7, 10, 14, 16, 18, 20, 22, 24):
            if integer(count_line) != 1:
                raise ValueError(f"line {count_line}: expected a count of 1")
        return cls(
            n=integer(6),
            nb=integer(8),
            pmap=integer(9),
            p=integer(11),
            q=integer(12),
            threshold=float(first(13)),
            pfact=integer(15),
            nbmin=integer(17),
            ndiv=integer(19),
            rfact=integer(21),
            bcast=integer(23),
            depth=integer(25),
            swap=integer(26),
            swap_threshold=integer(27),
            l1_form=integer(28),
            u_form=integer(29),
            equilibration=integer(30),
            alignment=integer(31),
        )


def plan_input(np: int, memory_bytes: int, size: HpccSize = "small") -> HpccInput:
    """The hpcc input for ``np`` processes in an environment with ``memory_bytes``.

    A preset gives a fixed matrix size per process (weak scaling, like hpcc's own
    default sizing), never more than MAX_MEMORY_FRACTION of memory; a float gives the
    matrix that fraction of memory.
    """
    p, q = process_grid(np)
    if memory_bytes <= 0:
        raise UsageError(f"hpcc: memory must be positive, got {memory_bytes}")
    cap = int(memory_bytes * MAX_MEMORY_FRACTION)
    if isinstance(size, str):
        if size not in PRESET_BYTES_PER_PROCESS:
            raise UsageError(
                f"unknown hpcc size {size!r}: use {', '.join(PRESET_BYTES_PER_PROCESS)} "
                f"or a memory fraction in (0, {MAX_MEMORY_FRACTION}]"
            )
        budget = min(PRESET_BYTES_PER_PROCESS[size] * np, cap)
    else:
        if not 0 < size <= MAX_MEMORY_FRACTION:
            raise UsageError(
                f"hpcc memory fraction must be in (0, {MAX_MEMORY_FRACTION}], got {size}"
            )
        budget = int(memory_bytes * size)
    nb = block_size(budget)
    n = problem_size(budget, nb)
    if n < 2 * nb:
        raise BenchmarkError(
            f"hpcc: {human_size(budget)} of matrix memory is too small for one {2 * nb}x"
            f"{2 * nb} block matrix: give the environment more memory or a larger size"
        )
    return HpccInput(n=n, nb=nb, p=p, q=q)


def warmup_input(spec: HpccInput) -> HpccInput:
    """``spec`` with an eighth of its matrix (never less than one 2NB x 2NB block)."""
    n = max(problem_size(spec.matrix_bytes // WARMUP_MATRIX_SHARE, spec.nb), 2 * spec.nb)
    return spec.model_copy(update={"n": min(n, spec.n)})


# --- output -------------------------------------------------------------------------

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FAILED_LINE = re.compile(r"FAILED|\(failed\)|[1-9][0-9]* tests? completed and failed")


def read_summary(text: str) -> dict[str, str]:
    """KEY -> VALUE text of the last summary section; ParseError if there is none or
    it was cut off (hpcc died or the file was truncated)."""
    lines = text.splitlines()
    begins = [i for i, line in enumerate(lines) if line.strip() == SUMMARY_BEGIN]
    if not begins:
        raise ParseError(
            f"{OUTPUT_FILE} has no summary section (hpcc did not finish): "
            f"{tail(text, 2) or 'empty file'}"
        )
    start = begins[-1] + 1
    ends = [i for i in range(start, len(lines)) if lines[i].strip() == SUMMARY_END]
    if not ends:
        raise ParseError(f"{OUTPUT_FILE}: summary section is truncated (no {SUMMARY_END!r})")
    summary: dict[str, str] = {}
    for line in lines[start : ends[0]]:
        key, sep, value = line.strip().partition("=")
        if sep and _KEY.match(key):
            summary[key] = value.strip()
    return summary


def _failure_detail(text: str) -> str:
    """The first line of hpcc's output that names a failed check, for the message."""
    for line in text.splitlines():
        if _FAILED_LINE.search(line):
            return line.strip()
    return "no failing check named in the output"


def _metric_value(metric: Metric, summary: dict[str, str]) -> MetricValue:
    raw = summary.get(metric.name)
    if raw is None:
        return metric.failed(f"{metric.name} missing from the hpcc summary")
    try:
        number = parse_number(raw)
    except ValueError:
        return metric.failed(f"{metric.name}={raw!r} is not a number")
    if math.isfinite(number) and number < 0:
        return metric.failed(f"{metric.name}={raw}: hpcc did not measure it")
    return metric.value(number)


def parse_output(text: str) -> list[MetricValue]:
    """Metrics of one hpccoutf.txt. ParseError for a failed or unreadable run."""
    summary = read_summary(text)
    success = summary.get("Success")
    if success is None:
        raise ParseError(f"{OUTPUT_FILE}: summary has no Success flag")
    if success != "1":
        raise ParseError(f"hpcc reports Success={success}: {_failure_detail(text)}")
    try:
        procs = int(summary.get("CommWorldProcs", ""))
    except ValueError as exc:
        raise ParseError(f"{OUTPUT_FILE}: summary has no valid CommWorldProcs") from exc
    wanted = METRICS + (COMMUNICATION_METRICS if procs > 1 else ())
    return [_metric_value(metric, summary) for metric in wanted]


# --- the suite ----------------------------------------------------------------------


class HpccSuite:
    """HPC Challenge under mpirun, sized from the environment's memory and np."""

    name = "hpcc"
    uses_np = True
    metrics = METRICS + COMMUNICATION_METRICS
    output_files = (OUTPUT_FILE,)

    def __init__(self, size: HpccSize = "small", *, bind: Bind = "core") -> None:
        plan_input(1, 1 << 40, size)  # reject a bad size at construction
        self.size = size
        self.bind: Bind = bind

    def validate(self, np_values: Sequence[int]) -> None:
        check_np_values(self.name, np_values)
        find_program("hpcc", PACKAGE)
        mpirun_argv(1, ["hpcc"], bind=self.bind)

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        return self._written(workdir, np, plan_input(np, memory_bytes, self.size))

    warmup_cost_share = WARMUP_COST_SHARE

    def prepare_warmup(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        """The warm-up: every test of the sample's run at an eighth of its matrix (HPL's
        N at about a third), with the same block size and grid. It loads and links the
        same programs and libraries and, under TCG, translates the same code, for a
        tenth of a sample's time: a TCG guest's full-size warm-up was half a minute."""
        spec = warmup_input(plan_input(np, memory_bytes, self.size))
        return self._written(workdir, np, spec)

    def _written(self, workdir: Path, np: int, spec: HpccInput) -> list[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        # hpcc appends to its output file: a stale one would hide this run's result.
        (workdir / OUTPUT_FILE).unlink(missing_ok=True)
        (workdir / INPUT_FILE).write_text(spec.render())
        return in_workdir(workdir, mpirun_argv(np, [find_program("hpcc", PACKAGE)], bind=self.bind))

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        require_exit_ok("hpcc (under mpirun)", exit_code, stdout, stderr)
        path = workdir / OUTPUT_FILE
        if not path.is_file():
            raise ParseError(f"hpcc wrote no {OUTPUT_FILE} in {workdir}: {tail(stderr) or '-'}")
        return parse_output(path.read_text(errors="replace"))


class HpccOptions(Frozen):
    """hpcc's reading of the run's options: ``--size`` as a memory share."""

    bind: Bind = "core"
    size: str = "small"
    hpcc_size: HpccSize | None = None  # set outright (tests, a run recorded so)


def hpcc_size(size: str) -> HpccSize:
    """``--size`` as hpcc reads it: medium, small (quick too) or a fraction of memory."""
    read = size_fraction(size)
    if isinstance(read, float):
        return read
    return "medium" if read == "medium" else "small"


def _build(options: SuiteOptions) -> list[Suite]:
    o = options.typed(HpccOptions)
    size = o.hpcc_size if o.hpcc_size is not None else hpcc_size(o.size)
    return [HpccSuite(size, bind=o.bind)]


KIND = SuiteKind(
    "hpcc",
    _build,
    "HPC Challenge from the distribution, input sized from memory and np",
    metrics=METRICS + COMMUNICATION_METRICS,
    packages=("hpcc", "openmpi-bin"),
    flags=FLAGS,
)
