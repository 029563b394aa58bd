"""The noise suite: our fixed-work-quantum benchmark (csrc/noise.c), run and read back.

One worker per CPU repeats a calibrated quantum of work; a quantum that took longer
than the fastest one on its CPU was interrupted (a "detour"). OS and hypervisor noise is
what the reference studies blame for poor scaling of fine-grained codes, so the detours
are reported per CPU and summarised over all CPUs.

The per-CPU figures come from the C program's own printout (detour = duration - min,
p99.9 by nearest rank, time lost = sum of all detours / sum of durations). This
duplicates ``hpcvm.stats.noise_summary``, which computes the same figures from raw
durations with the same definitions (a unit test holds the two together); the raw
durations are kept (``read_raw``) so the Python side can later use ``noise_summary``
alone.

The binary is built by ``make all`` into ``src/hpcvm/data/hpcvm-noise`` and found
next to the installed package; ``HPCVM_NOISE_BIN`` overrides the path.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpcvm.bench.core.kind import SuiteKind, SuiteOptions
from hpcvm.bench.core.launch import data_binary, in_workdir
from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError, parse_number, tail
from hpcvm.bench.core.suite import Suite, require_exit_ok
from hpcvm.bench.suites.noise import FLAGS
from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.model import Frozen
from hpcvm.units import format_cpu_list

BINARY_NAME = "hpcvm-noise"
BINARY_ENV = "HPCVM_NOISE_BIN"
RAW_FILE = "noise-raw.txt"
HEADER = "hpcvm-noise"


def noise_binary() -> Path:
    """Where the noise benchmark binary is: ``$HPCVM_NOISE_BIN`` or the package's
    data directory. BenchmarkError naming the fix when it is not built."""
    fix = "run `make all` in the hpcvm source tree (scripts/setup.sh does)"
    return data_binary(BINARY_NAME, BINARY_ENV, "noise benchmark", fix)


class CpuNoise(Frozen):
    """One CPU's line of the C program's summary (nanoseconds)."""

    cpu: int
    count: int
    min_ns: int
    median_ns: int
    max_detour_ns: int
    p999_detour_ns: int
    lost_fraction: float
    total_ns: int


class NoiseReport(Frozen):
    """The whole printout: run parameters and one entry per CPU."""

    quanta: int
    iterations: int
    target_ns: int
    quantum_ns: int
    cpus: tuple[CpuNoise, ...]


def _fields(line: str) -> dict[str, str]:
    pairs = (token.partition("=") for token in line.split())
    return {key: value for key, sep, value in pairs if sep}


def _int_field(fields: dict[str, str], key: str, line: str) -> int:
    try:
        return int(fields[key])
    except (KeyError, ValueError) as exc:
        raise ParseError(f"noise output: no integer {key}= in line {line!r}") from exc


_CPU_INT_FIELDS = (
    "cpu",
    "count",
    "min_ns",
    "median_ns",
    "max_detour_ns",
    "p999_detour_ns",
    "total_ns",
)


def parse_report(stdout: str) -> NoiseReport:
    """Read the C program's stdout; ParseError if the header or a CPU line is missing
    or malformed, or a CPU reports fewer quanta than asked."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    headers = [line for line in lines if line.split()[0] == HEADER]
    if not headers:
        raise ParseError(f"noise output has no {HEADER!r} header line")
    head = _fields(headers[0])
    quanta = _int_field(head, "quanta", headers[0])
    cpus: list[CpuNoise] = []
    for line in lines:
        if not line.startswith("cpu="):
            continue
        fields = _fields(line)
        try:
            lost = parse_number(fields["lost_fraction"])
        except (KeyError, ValueError) as exc:
            raise ParseError(f"noise output: bad lost_fraction in line {line!r}") from exc
        ints = {key: _int_field(fields, key, line) for key in _CPU_INT_FIELDS}
        if ints["count"] != quanta:
            raise ParseError(f"noise output: CPU {ints['cpu']} ran {ints['count']} of {quanta}")
        cpus.append(CpuNoise(lost_fraction=lost, **ints))
    if not cpus:
        raise ParseError("noise output has no per-CPU lines")
    return NoiseReport(
        quanta=quanta,
        iterations=_int_field(head, "iterations", headers[0]),
        target_ns=_int_field(head, "target_ns", headers[0]),
        quantum_ns=_int_field(head, "quantum_ns", headers[0]),
        cpus=tuple(cpus),
    )


def read_raw(path: Path) -> dict[int, list[int]]:
    """CPU -> every quantum's duration in ns, from the ``-o`` file (for
    ``hpcvm.stats.noise_summary`` and the report's detour distributions)."""
    raw: dict[int, list[int]] = {}
    try:
        text = path.read_text()
    except OSError as exc:
        raise ParseError(f"cannot read noise raw durations {path}: {exc.strerror}") from exc
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        head, *values = line.split()
        key, sep, cpu = head.partition("=")
        try:
            if key != "cpu" or not sep:
                raise ValueError(head)
            raw[int(cpu)] = [int(v) for v in values]
        except ValueError as exc:
            raise ParseError(f"{path}:{number}: malformed raw noise line") from exc
    return raw


def _metric(name: str, unit: str, description: str, short: str, *, extreme: bool = False) -> Metric:
    return Metric(
        name=name,
        unit=unit,
        higher_is_better=False,
        description=description,
        short=short,
        extreme=extreme,
    )


# The longest detour and the p99.9 of a sample are its rarest events: their mean over
# samples has an interval, but no number of repetitions narrows it to a target, so the
# stopping rule leaves them out and the table marks them. Time lost (a sum over every
# detour) and the fastest quantum are judged like any mean.
MAX_DETOUR = _metric(
    "NoiseMaxDetour_usec", "us", "longest detour on any CPU", "Noise max", extreme=True
)
P999_DETOUR = _metric(
    "NoiseP999Detour_usec",
    "us",
    "worst per-CPU 99.9th percentile detour",
    "Noise p99.9",
    extreme=True,
)
TIME_LOST = _metric(
    "NoiseTimeLost_pct", "%", "share of time lost to detours, all CPUs", "Noise lost"
)
QUANTUM = _metric("NoiseQuantum_usec", "us", "fastest quantum (work speed, not noise)", "Quantum")
METRICS = (MAX_DETOUR, P999_DETOUR, TIME_LOST, QUANTUM)


def per_cpu_name(metric: Metric, cpu: int) -> str:
    """Name of a per-CPU detail metric, e.g. ``NoiseMaxDetour_usec@cpu1``."""
    return f"{metric.name}@cpu{cpu}"


def _detail(metric: Metric, cpu: int) -> Metric:
    return metric.model_copy(update={"name": per_cpu_name(metric, cpu)})


def report_metrics(report: NoiseReport) -> list[MetricValue]:
    """Summary over all CPUs (worst detour, worst p99.9, time lost over all CPUs'
    time, fastest quantum), then the same per CPU."""
    total = sum(c.total_ns for c in report.cpus)
    lost = sum(c.lost_fraction * c.total_ns for c in report.cpus)
    values = [
        MAX_DETOUR.value(max(c.max_detour_ns for c in report.cpus) / 1e3),
        P999_DETOUR.value(max(c.p999_detour_ns for c in report.cpus) / 1e3),
        TIME_LOST.value(100.0 * lost / total if total else 0.0),
        QUANTUM.value(min(c.min_ns for c in report.cpus) / 1e3),
    ]
    for c in report.cpus:
        values += [
            _detail(MAX_DETOUR, c.cpu).value(c.max_detour_ns / 1e3),
            _detail(P999_DETOUR, c.cpu).value(c.p999_detour_ns / 1e3),
            _detail(TIME_LOST, c.cpu).value(100.0 * c.lost_fraction),
            _detail(QUANTUM, c.cpu).value(c.min_ns / 1e3),
        ]
    return values


class NoiseSuite:
    """The FWQ noise benchmark on every CPU of the environment (np is ignored)."""

    name = "noise"
    uses_np = False
    metrics = METRICS
    output_files = (RAW_FILE,)

    def __init__(
        self,
        *,
        quanta: int = 20000,
        quantum_us: int = 50,
        cpus: Sequence[int] | None = None,
        iterations: int | None = None,
    ) -> None:
        """``iterations``: the work of one quantum, fixed for the whole bench run so
        every environment times the same work (None: the binary calibrates itself)."""
        if quanta < 1 or quantum_us < 1:
            raise UsageError(
                f"noise: quanta and quantum must be positive, got {quanta} and {quantum_us} us"
            )
        if cpus is not None and (not cpus or min(cpus) < 0):
            raise UsageError(f"noise: bad CPU list {list(cpus)}")
        self.quanta = quanta
        self.quantum_us = quantum_us
        self.cpus = tuple(cpus) if cpus is not None else None
        self.iterations = iterations

    def validate(self, np_values: Sequence[int]) -> None:
        noise_binary()

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / RAW_FILE).unlink(missing_ok=True)
        argv = [str(noise_binary()), "-n", str(self.quanta), "-q", str(self.quantum_us)]
        if self.cpus is not None:
            argv += ["-c", format_cpu_list(self.cpus)]
        if self.iterations is not None:
            argv += ["-i", str(self.iterations)]
        return in_workdir(workdir, [*argv, "-o", RAW_FILE])

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        require_exit_ok(BINARY_NAME, exit_code, stdout, stderr)
        return report_metrics(parse_report(stdout))

    def raw_durations(self, workdir: Path) -> dict[int, list[int]]:
        """The run's raw durations (ns per quantum, per CPU) from its workdir."""
        return read_raw(workdir / RAW_FILE)


CALIBRATION_QUANTA = 200


def calibrate_iterations(quantum_us: int, cpu: int | None) -> int:
    """The work loop length whose quantum takes ``quantum_us`` on this host (on ``cpu``,
    the first PU native runs use). Done once per bench run: a VM then times the very
    same work, so its quantum time and detours compare with native's."""
    argv = [str(noise_binary()), "-n", str(CALIBRATION_QUANTA), "-q", str(quantum_us)]
    if cpu is not None:
        argv += ["-c", str(cpu)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise BenchmarkError(
            f"noise: calibrating the quantum failed: {tail(proc.stderr) or tail(proc.stdout)}"
        )
    try:
        return parse_report(proc.stdout).iterations
    except ParseError as exc:
        raise BenchmarkError(f"noise: calibrating the quantum failed: {exc}") from exc


class NoiseOptions(Frozen):
    """noise's options (FLAGS) and the work of one quantum, calibrated once per run."""

    size: str = "small"
    noise_quanta: int | None = None  # None: from --size
    noise_quantum_us: int = 50
    noise_iterations: int | None = None  # one quantum's work, fixed once per bench run


def _build(options: SuiteOptions) -> list[Suite]:
    o = options.typed(NoiseOptions)
    quanta = o.noise_quanta
    if quanta is None:
        quanta = 5000 if o.size == "quick" else 20000
    return [NoiseSuite(quanta=quanta, quantum_us=o.noise_quantum_us, iterations=o.noise_iterations)]


def _calibrate(
    options: SuiteOptions, recorded: SuiteOptions | None, first_pu: int | None
) -> SuiteOptions:
    """The quantum's work, calibrated once on native's first PU (or as recorded for a
    resumed run), so every environment times the same work."""
    o = options.typed(NoiseOptions)
    if o.noise_iterations is not None:
        return options
    if recorded is not None:
        iterations = recorded.typed(NoiseOptions).noise_iterations
    else:
        iterations = calibrate_iterations(o.noise_quantum_us, first_pu)
    return options if iterations is None else options.with_values(noise_iterations=iterations)


KIND = SuiteKind(
    "noise",
    _build,
    "hpcvm's fixed-work-quantum noise benchmark (csrc/noise.c) on every CPU",
    metrics=METRICS,
    flags=FLAGS,
    calibrate=_calibrate,
    derived=("noise_iterations",),
    spans_nodes=False,
)
