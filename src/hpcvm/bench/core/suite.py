"""The interface every benchmark suite implements, and what the orchestrator may rely on.

A suite knows how to set up one run and how to read its result; it knows nothing about
where the run happens. The orchestrator (``hpcvm bench``) drives it the same way
natively and in a guest, because the guest runs the host's very binaries over a shared
read-only root with a writable tmpfs overlay:

1. ``suite.validate(np_values)`` once, before anything starts: a missing binary, NPB
   directory or an impossible request is a UsageError/BenchmarkError right there.
2. A suite whose runs need inputs made once (``PreparesInputs``: a meshed and decomposed
   OpenFOAM case, the native reference answer) gets
   ``suite.prepare_inputs(directory, np_values)`` once per run, natively, after every
   suite is validated and before any environment starts, so outside every sample and
   its timing. ``directory`` is the suite's own, under the results directory; every
   guest sees it read-only at the same path (a share where the working directory does
   not cover it), and so does every node of ``bench --nodes`` that sees the results
   directory. Samples must only read it, so that each starts from the same input.
3. Per run, in a fresh empty host directory ``workdir``:
   ``argv = suite.prepare(workdir, np, memory_bytes)``. ``prepare`` writes its input
   files into ``workdir`` only, and returns a self-contained argv: absolute program
   paths, and it changes into ``workdir`` itself (``env -C``), because the guest agent's
   ``guest-exec`` has no working-directory parameter and a minimal PATH.
4. Natively: run ``argv``. In a guest: ``mkdir -p workdir`` (creatable on the overlay),
   copy every file ``prepare`` left in ``workdir`` into it, run ``argv``, then copy the
   files named in ``suite.output_files`` back into the host ``workdir``.
5. ``suite.parse(workdir, stdout, stderr, exit_code)`` -> list of MetricValue, or
   ParseError for a failed run (the orchestrator records a failed sample and goes on).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError, tail
from hpcvm.errors import UsageError


@runtime_checkable
class Suite(Protocol):
    """One benchmark, set up and read back; see the module docstring for the protocol."""

    @property
    def name(self) -> str:
        """Stable identifier stored with every sample (``hpcc``, ``noise``, ``npb:cg.A``)."""
        ...

    @property
    def uses_np(self) -> bool:
        """False when the process count is meaningless (noise runs one worker per CPU);
        the orchestrator then runs it once per environment instead of once per np."""
        ...

    @property
    def metrics(self) -> tuple[Metric, ...]:
        """Metrics every successful run reports (parse may add per-CPU detail)."""
        ...

    @property
    def output_files(self) -> tuple[str, ...]:
        """Files (relative to workdir) the run writes that ``parse`` reads or that are
        kept as data (noise's raw durations): a guest run must copy them back."""
        ...

    def validate(self, np_values: Sequence[int]) -> None:
        """Refuse, before anything runs, what cannot work (UsageError/BenchmarkError)."""
        ...

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        """Write the run's inputs into ``workdir`` and return its argv."""
        ...

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        """Read the run's results; ParseError if the run failed or is unreadable."""
        ...


@runtime_checkable
class WarmsUpSmaller(Protocol):
    """What a suite whose sample is long may add (hpcc does): a warm-up run of the same
    program on less data, so that the warm-up loads, links and (under TCG) translates
    the same code without costing a whole sample."""

    @property
    def warmup_cost_share(self) -> float:
        """About what a warm-up costs as a share of a sample (in (0, 1]): until a cell's
        first sample is timed, the loop estimates its cost from the warm-up by it."""
        ...

    def prepare_warmup(self, workdir: Path, np: int, memory_bytes: int) -> list[str]: ...


@runtime_checkable
class PreparesInputs(Protocol):
    """What a suite whose samples share inputs made once per run may add (openfoam,
    lammps): step 2 of the module docstring. ``prepare_inputs`` also computes the
    native reference each sample's answer must match (bench/suites/reference.py); it raises
    BenchmarkError when a step fails, and the run fails before anything is measured."""

    def prepare_inputs(self, directory: Path, np_values: Sequence[int]) -> None: ...


@runtime_checkable
class DescribesSamples(Protocol):
    """What a suite may add (NPB does): facts about each run stored with its sample
    (``verification``, ``class``, ...), a short label per metric and np, and the step in
    which the program prints a metric, with a warning when that step is coarse."""

    def sample_facts(
        self, workdir: Path, stdout: str, stderr: str, exit_code: int
    ) -> dict[str, str]: ...

    def label(self, metric: str, np: int) -> str: ...

    def resolution(self, metric: str) -> float | None: ...

    def resolution_warning(self, metric: str, np: int, values: Sequence[float]) -> str | None: ...


def require_exit_ok(what: str, exit_code: int, stdout: str, stderr: str) -> None:
    """A non-zero exit is a failed run: say which program and show the end of its output."""
    if exit_code != 0:
        detail = tail(stderr) or tail(stdout) or "no output"
        raise ParseError(f"{what} exited with code {exit_code}: {detail}")


def check_np_values(suite_name: str, np_values: Sequence[int]) -> None:
    """np must be positive; shared by the suites that run under mpirun."""
    bad = [n for n in np_values if n < 1]
    if bad or not np_values:
        raise UsageError(
            f"{suite_name}: process counts must be positive integers, got "
            f"{', '.join(map(str, np_values)) or 'none'}"
        )
