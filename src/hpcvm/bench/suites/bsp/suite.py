"""The bsp suite: a bulk-synchronous microbenchmark (csrc/bsp.c) run under mpirun.

Every rank repeats a step: a fixed grain of work (noise's own work loop, calibrated once
per run natively so every environment does the same work), then an ``MPI_Allreduce``.
Each rank's grain and step times are written to ``bsp-raw.txt`` and read here. It is what
``report --scale`` checks its prediction against at the ranks a run has: the slowdown a
bulk-synchronous code really suffers from the noise of the environment it runs in.

Metrics (from the raw times, every rank and step):

- ``BspSlowdown_pct``: mean step time over the quiet step, minus one. The quiet step is
  the fastest grain of any rank plus the fastest collective (a step's time minus its own
  grain, fastest over ranks and steps): what a step would take on a machine with no noise.
- ``BspComputeSlowdown_pct``: the delay of the slowest rank's grain per step (its grain
  minus that rank's fastest), averaged over steps, over the quiet grain: the part of the
  slowdown the ranks' work shows, without the time the collective itself lost.
- ``BspStep_usec`` and ``BspGrain_usec``: the mean step and the quiet grain.

The binary is built by ``make all`` (with Open MPI's ``mpicc``) into
``src/hpcvm/data/hpcvm-bsp``; ``HPCVM_BSP_BIN`` overrides the path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hpcvm.bench.core.kind import SuiteKind, SuiteOptions
from hpcvm.bench.core.launch import Bind, data_binary, in_workdir, mpirun_argv
from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError
from hpcvm.bench.core.suite import Suite, check_np_values, require_exit_ok
from hpcvm.bench.suites.bsp import FLAGS
from hpcvm.bench.suites.noise.suite import calibrate_iterations
from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.model import Frozen

BINARY_NAME = "hpcvm-bsp"
BINARY_ENV = "HPCVM_BSP_BIN"
RAW_FILE = "bsp-raw.txt"
ITERATIONS_FILE = "bsp-iterations"
HEADER = "hpcvm-bsp"
DEFAULT_STEPS = 2000
DEFAULT_GRAIN_US = 100

SLOWDOWN = Metric(
    name="BspSlowdown_pct",
    unit="%",
    higher_is_better=False,
    description="mean step (grain + allreduce) over the quiet step, minus one",
    short="BSP slowdown",
)
COMPUTE_SLOWDOWN = Metric(
    name="BspComputeSlowdown_pct",
    unit="%",
    higher_is_better=False,
    description="slowest rank's grain delay per step over the quiet grain",
    short="BSP grain delay",
)
STEP = Metric(
    name="BspStep_usec",
    unit="us",
    higher_is_better=False,
    description="mean step time (grain + allreduce)",
    short="BSP step",
)
GRAIN = Metric(
    name="BspGrain_usec",
    unit="us",
    higher_is_better=False,
    description="quiet grain: the fastest grain of any rank",
    short="BSP grain",
)
METRICS = (SLOWDOWN, COMPUTE_SLOWDOWN, STEP, GRAIN)


def bsp_binary() -> Path:
    """Where the bsp binary is: ``$HPCVM_BSP_BIN`` or the package's data directory;
    BenchmarkError naming the fix when it is not built."""
    fix = "install libopenmpi-dev and run `make all` in the hpcvm source tree"
    return data_binary(BINARY_NAME, BINARY_ENV, "bsp benchmark", fix)


def read_raw(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(grains, steps): ns, one row per rank, one column per step."""
    rows: dict[str, dict[int, list[int]]] = {"grain": {}, "step": {}}
    try:
        text = path.read_text()
    except OSError as exc:
        raise ParseError(f"cannot read bsp raw times {path}: {exc.strerror}") from exc
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            kind, rank, *values = line.split()
            key, _, index = rank.partition("=")
            if kind not in rows or key != "rank":
                raise ValueError(line)
            rows[kind][int(index)] = [int(v) for v in values]
        except ValueError as exc:
            raise ParseError(f"{path}:{number}: malformed bsp raw line") from exc
    grains, steps = rows["grain"], rows["step"]
    if not grains or sorted(grains) != sorted(steps) or sorted(grains) != list(range(len(grains))):
        raise ParseError(f"{path}: bsp raw times lack a rank's grain or step line")
    lengths = {len(v) for v in (*grains.values(), *steps.values())}
    if len(lengths) != 1 or 0 in lengths:
        raise ParseError(f"{path}: bsp raw times: ranks ran different numbers of steps")
    order = sorted(grains)
    return (
        np.array([grains[r] for r in order], dtype=np.float64),
        np.array([steps[r] for r in order], dtype=np.float64),
    )


def bsp_metrics(grains: np.ndarray, steps: np.ndarray) -> list[MetricValue]:
    """The suite's metrics from every rank's grain and step times (module docstring)."""
    if grains.shape != steps.shape or grains.size == 0 or float(grains.min()) <= 0:
        raise ParseError("bsp raw times: no positive grains to read")
    quiet_grain = float(grains.min())
    quiet_collective = max(float((steps - grains).min()), 0.0)
    per_step_delay = (grains - grains.min(axis=1, keepdims=True)).max(axis=0)
    mean_step = float(steps.mean())
    return [
        SLOWDOWN.value(100.0 * (mean_step / (quiet_grain + quiet_collective) - 1.0)),
        COMPUTE_SLOWDOWN.value(100.0 * float(per_step_delay.mean()) / quiet_grain),
        STEP.value(mean_step / 1e3),
        GRAIN.value(quiet_grain / 1e3),
    ]


class BspSuite:
    """Fixed grains of work between allreduces on np MPI ranks, every step timed."""

    name = "bsp"
    uses_np = True
    metrics = METRICS
    output_files = (RAW_FILE,)

    def __init__(
        self,
        *,
        steps: int = DEFAULT_STEPS,
        grain_us: int = DEFAULT_GRAIN_US,
        iterations: int | None = None,
        bind: Bind = "core",
    ) -> None:
        """``iterations``: the grain's work (None: calibrated once per run natively by
        ``prepare_inputs``, with noise's calibration, so every environment does the same)."""
        if steps < 1 or grain_us < 1:
            raise UsageError(
                f"bsp: steps and grain must be positive, got {steps} and {grain_us} us"
            )
        self.steps = steps
        self.grain_us = grain_us
        self.iterations = iterations
        self.bind: Bind = bind

    def validate(self, np_values: Sequence[int]) -> None:
        check_np_values(self.name, np_values)
        bsp_binary()
        mpirun_argv(max(np_values), [str(bsp_binary())], bind=self.bind)

    def prepare_inputs(self, directory: Path, np_values: Sequence[int]) -> None:
        """Calibrate the grain's work once per run, natively, and keep it in
        ``directory`` so that a resumed run does the very same work."""
        if self.iterations is not None:
            return
        kept = directory / ITERATIONS_FILE
        try:
            self.iterations = int(kept.read_text().strip())
            return
        except (OSError, ValueError):
            pass
        self.iterations = calibrate_iterations(self.grain_us, None)
        directory.mkdir(parents=True, exist_ok=True)
        kept.write_text(f"{self.iterations}\n")

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        if self.iterations is None:
            raise BenchmarkError("bsp: the grain was not calibrated (prepare_inputs not run)")
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / RAW_FILE).unlink(missing_ok=True)
        program = [str(bsp_binary()), "-s", str(self.steps), "-i", str(self.iterations)]
        return in_workdir(workdir, mpirun_argv(np, [*program, "-o", RAW_FILE], bind=self.bind))

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        require_exit_ok(f"{BINARY_NAME} (under mpirun)", exit_code, stdout, stderr)
        if not any(line.startswith(HEADER) for line in stdout.splitlines()):
            raise ParseError(f"{BINARY_NAME} printed no {HEADER!r} line")
        return bsp_metrics(*read_raw(workdir / RAW_FILE))


class BspOptions(Frozen):
    """bsp's options (FLAGS)."""

    bind: Bind = "core"
    bsp_steps: int = 2000
    bsp_grain_us: int = 100


def _build(options: SuiteOptions) -> list[Suite]:
    o = options.typed(BspOptions)
    return [BspSuite(steps=o.bsp_steps, grain_us=o.bsp_grain_us, bind=o.bind)]


KIND = SuiteKind(
    "bsp",
    _build,
    "hpcvm's bulk-synchronous microbenchmark (csrc/bsp.c): grains of work between "
    "allreduces on --np ranks, each step timed (what report --scale checks against)",
    metrics=METRICS,
    packages=("openmpi-bin",),
    flags=FLAGS,
)
