"""NetPIPE's MPI module (Debian's ``netpipe-openmpi``, program ``NPopenmpi``): latency and
bandwidth of one pair of MPI ranks, per message size.

What NetPIPE does (3.7, checked against its output here): ping-pong between exactly two
ranks at message sizes 1, 2, 3, 4, 6, 8, 12, 16, ... bytes (two per octave with ``-p 0``,
which turns off the +-3-byte perturbations) up to ``-u``. Per size it runs three trials of
``nrepeat`` round trips and keeps the fastest trial's one-way time (half the round trip).
Rank 0 writes one line per size to ``-o FILE``: bytes, rate in NetPIPE's "Mbps" (which is
2^20 bit/s) and the one-way time in seconds printed to 8 decimals (10 ns steps).

What hpcvm reads: the file, not the progress lines. The time column's 10 ns step is
4% of a 0.25 us shared-memory latency, so the one-way time is taken from the rate column
(6 decimals, full precision: ``t = 8 * bytes / (rate * 2^20)``) and checked against the
time column to within its rounding, which also proves the columns mean what hpcvm thinks.

Metrics, the same set in every run so samples compare: latency (us) and bandwidth (Mbit/s,
SI: 10^6 bit/s) at the powers of 4 from 1 B to 1 MiB, each carrying its size as
``Metric.message_bytes`` (what the report's message-size figures are drawn from), plus the
peak bandwidth over every size NetPIPE measured. The headline latency is ``latency_1B``.

Repetitions (``-n``) by ``--size``: quick 20 (a smoke size for tests and TCG guests,
where every byte of the large messages crosses an emulated NIC: the two-node bench test
took 618-874 s at 200 and 266 s at 50, on the 2-core development machine; at 50 a TCG
guest's sample took 16-17 s, or 92 s when every message waited about 5 ms:
docs/netpipe.md), small 1000 (about 10 s natively on a 2-core host); medium leaves the
count to NetPIPE, which sizes each trial to 0.25 s (about 30 s natively, and about as
long in a slow guest: it is bounded by time, not work). The upper bound is 1 MiB in all
three so that every size has every metric. NetPIPE times with gettimeofday (1 us steps),
so a latency is known to 0.5/n us: 0.025 us at quick, a tenth of a native shared-memory
latency (a resolution warning says so when it matters).

Two ranks, always: NetPIPE is a ping-pong and refuses any other count, so ``--np`` does
not apply (``uses_np`` is False, like noise). Ranks start through ``launch.mpirun_argv``,
so they land where every MPI suite's ranks land: two cores of one environment, or one rank
per node once ``bench --nodes`` spans nodes. An environment with one CPU cannot run it;
the failed sample says so.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, cast

from hpcvm.bench.core.kind import SuiteKind, SuiteOptions, word_size
from hpcvm.bench.core.launch import Bind, find_program, in_workdir, mpirun_argv
from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError, tail
from hpcvm.bench.core.resolution import resolution_warning
from hpcvm.bench.core.suite import Suite
from hpcvm.bench.suites.netpipe import FLAGS
from hpcvm.errors import UsageError
from hpcvm.model import Frozen

PROGRAM = "NPopenmpi"
PACKAGE = "netpipe-openmpi"
OUTPUT_FILE = "np.out"
RANKS = 2
MAX_BYTES = 1 << 20
SIZES: tuple[int, ...] = tuple(4**k for k in range(11))  # 1 B .. 1 MiB
NETPIPE_MBPS = float(1 << 20)  # bit/s in one of NetPIPE's "Mbps"
CLOCK_STEP_US = 1.0  # gettimeofday
# NetPIPE also stops early once one message takes longer than its limit (1 s in 3.7);
# a last time below this cannot have stopped it, so a short file was cut off.
STOP_RULE_S = 0.1

NetpipeSize = Literal["quick", "small", "medium"]
REPEATS: dict[str, int | None] = {"quick": 20, "small": 1000, "medium": None}


def size_name(nbytes: int) -> str:
    """``1B``, ``256B``, ``4KiB``, ``1MiB``: the size part of a metric's name."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def _latency(nbytes: int) -> Metric:
    return Metric(
        name=f"latency_{size_name(nbytes)}",
        unit="us",
        higher_is_better=False,
        description=f"one-way time of a {size_name(nbytes)} message (half the round trip)",
        short=f"lat {size_name(nbytes)}",
        message_bytes=nbytes,
    )


def _bandwidth(nbytes: int) -> Metric:
    return Metric(
        name=f"bandwidth_{size_name(nbytes)}",
        unit="Mbit/s",
        higher_is_better=True,
        description=f"{size_name(nbytes)} message over its one-way time",
        short=f"bw {size_name(nbytes)}",
        message_bytes=nbytes,
    )


LATENCY = {n: _latency(n) for n in SIZES}
BANDWIDTH = {n: _bandwidth(n) for n in SIZES}
PEAK_BANDWIDTH = Metric(
    name="peak_bandwidth",
    unit="Mbit/s",
    higher_is_better=True,
    description="highest bandwidth over every message size NetPIPE measured",
    short="peak bw",
)
METRICS: tuple[Metric, ...] = (*LATENCY.values(), *BANDWIDTH.values(), PEAK_BANDWIDTH)


# --- output -------------------------------------------------------------------------


class Point(Frozen):
    """One line of NetPIPE's output file: a message size and its one-way time."""

    nbytes: int
    seconds: float

    @property
    def latency_us(self) -> float:
        return self.seconds * 1e6

    @property
    def mbit_s(self) -> float:
        return 8 * self.nbytes / self.seconds / 1e6


def _point(number: int, line: str) -> Point:
    """One ``bytes rate time`` line; ParseError naming the line otherwise."""
    where = f"{OUTPUT_FILE} line {number}"
    fields = line.split()
    if len(fields) != 3:
        raise ParseError(f"{where}: expected 'bytes Mbps seconds', got {line.strip()!r}")
    try:
        nbytes, rate, printed = int(fields[0]), float(fields[1]), float(fields[2])
    except ValueError:
        raise ParseError(f"{where}: not numbers: {line.strip()!r}") from None
    if nbytes < 1 or not (math.isfinite(rate) and rate > 0 and math.isfinite(printed)):
        raise ParseError(f"{where}: impossible size, rate or time: {line.strip()!r}")
    seconds = 8 * nbytes / (rate * NETPIPE_MBPS)
    # Both columns print one time: the rate with 6 decimals (%f), the time with 8. Each
    # is rounded, so they agree within both roundings; the finer of the two is kept (the
    # rate for fast links, the time column when a slow link's rate has few digits left).
    rate_rel = 0.5e-6 / rate
    time_abs = 0.5e-8
    if abs(seconds - printed) > seconds * (rate_rel + 1e-6) + time_abs + 1e-12:
        raise ParseError(
            f"{where}: rate {fields[1]} Mbps means {seconds:.3e} s but the time column says "
            f"{fields[2]} s: not NetPIPE 3.7's output format"
        )
    if printed > 0 and time_abs / printed < rate_rel:
        seconds = printed
    return Point(nbytes=nbytes, seconds=seconds)


def read_points(text: str) -> list[Point]:
    """Every size of one NetPIPE output file, in order; ParseError for an empty,
    garbled or out-of-order file."""
    points = [_point(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not points:
        raise ParseError(f"{OUTPUT_FILE} is empty: NetPIPE measured no message size")
    sizes = [p.nbytes for p in points]
    if sizes != sorted(set(sizes)):
        raise ParseError(f"{OUTPUT_FILE}: message sizes are not increasing: {sizes[:8]}...")
    return points


def point_metrics(points: Sequence[Point], complaint: str = "") -> list[MetricValue]:
    """The fixed metric set of one run's points. A file that ends before 1 MiB is a
    cut-off run (ParseError with ``complaint``), unless NetPIPE's own time limit ended
    it: then the sizes it did not reach are failed metrics saying so."""
    by_size = {p.nbytes: p for p in points}
    last = points[-1]
    missing = [n for n in SIZES if n not in by_size]
    if last.nbytes < MAX_BYTES and last.seconds < STOP_RULE_S:
        raise ParseError(
            f"{OUTPUT_FILE} ends at {size_name(last.nbytes)}, before {size_name(MAX_BYTES)}: "
            f"the run was cut short ({complaint or 'NetPIPE printed nothing more'})"
        )
    values: list[MetricValue] = []
    for metrics, read in ((LATENCY, "latency_us"), (BANDWIDTH, "mbit_s")):
        for nbytes, metric in metrics.items():
            if nbytes in missing:
                why = (
                    f"NetPIPE stopped at {size_name(last.nbytes)}: one message took "
                    f"{last.seconds:.2f} s, beyond its time limit"
                )
                values.append(metric.failed(why))
            else:
                values.append(metric.value(getattr(by_size[nbytes], read)))
    values.append(PEAK_BANDWIDTH.value(max(p.mbit_s for p in points)))
    return values


_CHATTER = re.compile(
    r"^(Using no perturbations|Sending output to |Now starting the main loop|\d+: \S+$"
    r"|\s*\d+:\s+\d+ bytes\s+\d+ times -->|\[[^]]*\] MCW rank \d+ bound to)"
)


def complaint(stdout: str, stderr: str) -> str:
    """What NetPIPE itself said went wrong ("Need at least two processes (only given 1)",
    "Start MUST be LESS than end"): its lines that are neither its usual chatter, nor
    progress, nor Open MPI's dashed help blocks; "" when it said nothing else."""
    said: list[str] = []
    for text in (stdout, stderr):
        in_block = False
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("-----"):
                in_block = not in_block
                continue
            if in_block or not line or _CHATTER.match(line) or line in said:
                continue
            said.append(line)
    return " | ".join(said[:3])


def mpirun_refusal(stdout: str, stderr: str) -> str:
    """The first sentence of Open MPI's first dashed help block (mpirun's refusal to
    start, on either stream), with what to do when it found too few cores; "" if none."""
    for text in (stderr, stdout):
        lines = [line.strip() for line in text.splitlines()]
        starts = [i for i, line in enumerate(lines) if line.startswith("-----")]
        if not starts:
            continue
        body = lines[starts[0] + 1 : starts[1] if len(starts) > 1 else None]
        paragraph = " ".join(itertools.takewhile(bool, body))
        sentence = paragraph.split(":")[0].split(". ")[0].strip()
        if "not enough slots" in sentence:
            return (
                f"{sentence}: NetPIPE always runs {RANKS} ranks, one per core; give VMs "
                f"{RANKS} vCPUs (--vm-vcpus {RANKS}) and native runs {RANKS} CPUs"
            )
        return sentence
    return ""


def _rank_hosts(stdout: str) -> dict[str, str]:
    """``rank0_host``/``rank1_host`` from NetPIPE's "0: name" lines: where each rank ran
    (the evidence that a run spanned two nodes, or did not)."""
    hosts: dict[str, str] = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"([01]): (\S+)", line.strip())
        if match:
            hosts[f"rank{match.group(1)}_host"] = match.group(2)
    return hosts


# --- the suite ----------------------------------------------------------------------


class NetpipeSuite:
    """NetPIPE between two MPI ranks, latency and bandwidth per message size."""

    name = "netpipe"
    uses_np = False  # always RANKS ranks: a ping-pong has two ends
    metrics = METRICS
    output_files = (OUTPUT_FILE,)

    def __init__(self, size: str = "small", *, bind: Bind = "core") -> None:
        if size not in REPEATS:
            raise UsageError(f"unknown netpipe size {size!r}: use {', '.join(REPEATS)}")
        self.size = size
        self.repeats = REPEATS[size]
        self.bind: Bind = bind

    def argv(self) -> list[str]:
        """NPopenmpi's own arguments (see the module docstring for the choices)."""
        args = [find_program(PROGRAM, PACKAGE), "-p", "0", "-u", str(MAX_BYTES)]
        if self.repeats is not None:
            args += ["-n", str(self.repeats)]
        return [*args, "-o", OUTPUT_FILE]

    def validate(self, np_values: Sequence[int]) -> None:
        """NPopenmpi and mpirun must exist; ``np_values`` do not apply (two ranks)."""
        find_program(PROGRAM, PACKAGE)
        mpirun_argv(RANKS, ["NPopenmpi"], bind=self.bind)

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        # a stale file would pass for this run's result
        (workdir / OUTPUT_FILE).unlink(missing_ok=True)
        return in_workdir(workdir, mpirun_argv(RANKS, self.argv(), bind=self.bind))

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        said = complaint(stdout, stderr)
        if exit_code != 0:
            refused = mpirun_refusal(stdout, stderr)
            detail = said or refused or tail(stderr) or tail(stdout) or "no output"
            raise ParseError(f"NetPIPE (under mpirun) exited with code {exit_code}: {detail}")
        path = workdir / OUTPUT_FILE
        if not path.is_file():
            raise ParseError(f"NetPIPE wrote no {OUTPUT_FILE}: {said or tail(stderr) or '-'}")
        return point_metrics(read_points(path.read_text(errors="replace")), said)

    # -- DescribesSamples -----------------------------------------------------------------

    def sample_facts(
        self, workdir: Path, stdout: str, stderr: str, exit_code: int
    ) -> dict[str, str]:
        """Where each rank ran, and the size of the peak bandwidth."""
        facts = _rank_hosts(stdout)
        path = workdir / OUTPUT_FILE
        try:
            points = read_points(path.read_text(errors="replace")) if path.is_file() else []
        except ParseError:
            points = []
        if points:
            peak = max(points, key=lambda p: p.mbit_s)
            facts["peak_bandwidth_at"] = size_name(peak.nbytes)
        return facts

    def label(self, metric: str, np: int) -> str:
        short = next((m.short for m in METRICS if m.name == metric), metric)
        return f"NetPIPE {short}"

    def resolution(self, metric: str) -> float | None:
        """A latency's timing step in us (the clock's step over 2n one-way trips);
        None for bandwidths and at medium, where each trial lasts 0.25 s."""
        if self.repeats is None or not metric.startswith("latency_"):
            return None
        return CLOCK_STEP_US / (2 * self.repeats)

    def resolution_warning(self, metric: str, np: int, values: Sequence[float]) -> str | None:
        step = self.resolution(metric)
        if step is None:
            return None
        advice = "use a larger --size (more repetitions per message size)"
        return resolution_warning(self.label(metric, np), values, step, "us", advice)


def _build(options: SuiteOptions) -> list[Suite]:
    size = cast(NetpipeSize, word_size(options, "netpipe_size"))
    return [NetpipeSuite(size, bind=options.bind)]


KIND = SuiteKind(
    "netpipe",
    _build,
    "NetPIPE ping-pong between 2 MPI ranks: latency and bandwidth per message size "
    "(--np does not apply)",
    metrics=METRICS,
    packages=("netpipe-openmpi", "openmpi-bin"),
    flags=FLAGS,
)
