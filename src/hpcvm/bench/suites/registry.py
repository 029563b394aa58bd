"""Registry: suite name (as typed after ``--suite``) -> the suite objects it stands for.

Most names give one suite; ``npb`` gives one per kernel, in the class ``--size`` picks
(quick S, small W, medium A) or the class named (``cg.B``). Everything a user can get
wrong (unknown name, npb without a directory, cmd without a regex or direction, a bad
regex) is a UsageError here, before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcvm.bench.core.launch import Bind
from hpcvm.bench.core.metrics import Metric
from hpcvm.bench.core.suite import Suite
from hpcvm.bench.suites.bsp import METRICS as BSP_METRICS
from hpcvm.bench.suites.bsp import BspSuite
from hpcvm.bench.suites.cmd import CmdSuite
from hpcvm.bench.suites.hpcc import COMMUNICATION_METRICS, HpccSize, HpccSuite
from hpcvm.bench.suites.hpcc import METRICS as HPCC_METRICS
from hpcvm.bench.suites.lammps import METRICS as LAMMPS_METRICS
from hpcvm.bench.suites.lammps import PACKAGES as LAMMPS_PACKAGES
from hpcvm.bench.suites.lammps import LammpsSize, LammpsSuite
from hpcvm.bench.suites.netpipe import METRICS as NETPIPE_METRICS
from hpcvm.bench.suites.netpipe import NetpipeSize, NetpipeSuite
from hpcvm.bench.suites.noise import METRICS as NOISE_METRICS
from hpcvm.bench.suites.noise import NoiseSuite
from hpcvm.bench.suites.npb import LABELS as NPB_LABELS
from hpcvm.bench.suites.npb import METRICS as NPB_METRICS
from hpcvm.bench.suites.npb import discover
from hpcvm.bench.suites.openfoam import METRICS as OPENFOAM_METRICS
from hpcvm.bench.suites.openfoam import PACKAGES as OPENFOAM_PACKAGES
from hpcvm.bench.suites.openfoam import OpenfoamSize, OpenfoamSuite
from hpcvm.errors import UsageError
from hpcvm.model import Frozen
from hpcvm.registry import Registry


class SuiteOptions(Frozen):
    """Every suite's settings, as the ``bench`` command collects them from its options."""

    bind: Bind = "core"
    hpcc_size: HpccSize = "small"
    noise_quanta: int = 20000
    noise_quantum_us: int = 50
    noise_iterations: int | None = None  # one quantum's work, fixed once per bench run
    bsp_steps: int = 2000  # bench --bsp-steps and --bsp-grain-us
    bsp_grain_us: int = 100
    npb_dir: Path | None = None
    npb_kernels: tuple[str, ...] = ()
    npb_size: str | float = "small"  # --size as given: picks one NPB class per kernel
    netpipe_size: NetpipeSize = "small"  # --size quick/small/medium: repetitions per size
    openfoam_size: OpenfoamSize = "small"  # --size quick/small/medium: mesh and time steps
    lammps_size: LammpsSize = "small"  # --size quick/small/medium: atoms
    cmd: str | None = None
    metric: str | None = None  # regex with one group
    higher_is_better: bool | None = None  # None: the user has not said
    unit: str = ""
    metric_name: str = "value"
    cmd_cwd: Path | None = None  # default: the current directory
    cmd_mpi: bool = False


def _hpcc(options: SuiteOptions) -> list[Suite]:
    return [HpccSuite(options.hpcc_size, bind=options.bind)]


def _noise(options: SuiteOptions) -> list[Suite]:
    return [
        NoiseSuite(
            quanta=options.noise_quanta,
            quantum_us=options.noise_quantum_us,
            iterations=options.noise_iterations,
        )
    ]


def _bsp(options: SuiteOptions) -> list[Suite]:
    return [BspSuite(steps=options.bsp_steps, grain_us=options.bsp_grain_us, bind=options.bind)]


def _netpipe(options: SuiteOptions) -> list[Suite]:
    return [NetpipeSuite(options.netpipe_size, bind=options.bind)]


def _openfoam(options: SuiteOptions) -> list[Suite]:
    return [OpenfoamSuite(options.openfoam_size, bind=options.bind)]


def _lammps(options: SuiteOptions) -> list[Suite]:
    return [LammpsSuite(options.lammps_size, bind=options.bind)]


def _npb(options: SuiteOptions) -> list[Suite]:
    if options.npb_dir is None:
        raise UsageError("--suite npb needs --npb-dir DIR (the bin directory of your NPB build)")
    return list(
        discover(options.npb_dir, options.npb_kernels, size=options.npb_size, bind=options.bind)
    )


def _cmd(options: SuiteOptions) -> list[Suite]:
    if not options.cmd:
        raise UsageError("--suite cmd needs --cmd 'COMMAND ARGS'")
    if not options.metric:
        raise UsageError("--cmd needs --metric REGEX with one group around the number")
    if options.higher_is_better is None:
        raise UsageError("--cmd needs --lower-is-better or --higher-is-better")
    return [
        CmdSuite(
            options.cmd,
            options.metric,
            higher_is_better=options.higher_is_better,
            unit=options.unit,
            metric_name=options.metric_name,
            cwd=options.cmd_cwd,
            mpi=options.cmd_mpi,
            bind=options.bind,
        )
    ]


@dataclass(frozen=True)
class SuiteKind:
    """Everything hpcvm knows about one kind of suite, in one place: how to build it from
    the bench options, what it is, the Debian packages it runs (install hints and the
    versions recorded with a run), and the short labels of its metrics for figures.

    ``owns`` tells which stored suite names are of this kind (npb stores ``npb:cg.S``);
    ``label`` overrides the labels of ``metrics`` (NPB's depend on the kernel)."""

    name: str
    build: Callable[[SuiteOptions], list[Suite]]
    description: str
    metrics: tuple[Metric, ...] = ()
    packages: tuple[str, ...] = ()
    owns: Callable[[str], bool] | None = None
    label: Callable[[str, str], str | None] | None = None
    np_label: Callable[[str, str, int], str | None] | None = None  # "CG time, np 2"
    spans_nodes: bool = True  # False: it measures one node (bench --nodes refuses it)

    def stores(self, suite: str) -> bool:
        return self.owns(suite) if self.owns is not None else suite == self.name

    def short_name(self, suite: str, metric: str) -> str | None:
        if self.label is not None:
            return self.label(suite, metric)
        return next((m.short for m in self.metrics if m.name == metric and m.short), None)


REGISTRY: Registry[SuiteKind] = Registry("suite")


def register(kind: SuiteKind) -> None:
    """Add a suite kind (hpcvm's own below, or a plugin's: see hpcvm/plugins.py)."""
    REGISTRY.register(kind.name, kind)


def _npb_label(suite: str, metric: str) -> str | None:
    """What an NPB figure shows: "CG time", "CG Mop/s"."""
    word = NPB_LABELS.get(metric)
    if word is None:
        return None
    return f"{suite.removeprefix('npb:').split('.')[0].upper()} {word}"


def _npb_np_label(suite: str, metric: str, np: int) -> str | None:
    name = _npb_label(suite, metric)
    return None if name is None else f"{name}, np {np}"


for _kind in (
    SuiteKind(
        "hpcc",
        _hpcc,
        "HPC Challenge from the distribution, input sized from memory and np",
        metrics=HPCC_METRICS + COMMUNICATION_METRICS,
        packages=("hpcc", "openmpi-bin"),
    ),
    SuiteKind(
        "noise",
        _noise,
        "hpcvm's fixed-work-quantum noise benchmark (csrc/noise.c) on every CPU",
        metrics=NOISE_METRICS,
        spans_nodes=False,
    ),
    SuiteKind(
        "npb",
        _npb,
        "your NAS Parallel Benchmarks MPI binaries (--npb-dir), one class per kernel",
        metrics=NPB_METRICS,
        packages=("openmpi-bin",),
        owns=lambda suite: suite.startswith("npb:"),
        label=_npb_label,
        np_label=_npb_np_label,
    ),
    SuiteKind(
        "netpipe",
        _netpipe,
        "NetPIPE ping-pong between 2 MPI ranks: latency and bandwidth per message size "
        "(--np does not apply)",
        metrics=NETPIPE_METRICS,
        packages=("netpipe-openmpi", "openmpi-bin"),
    ),
    SuiteKind("cmd", _cmd, "any command and a regex (--cmd, --metric)"),
):
    register(_kind)

register(
    SuiteKind(
        "openfoam",
        _openfoam,
        "OpenFOAM's icoFoam on the cavity tutorial, decomposed over --np ranks, checked "
        "against native's residuals",
        metrics=OPENFOAM_METRICS,
        packages=OPENFOAM_PACKAGES,
    )
)
register(
    SuiteKind(
        "lammps",
        _lammps,
        "LAMMPS's Lennard-Jones benchmark, checked against native's final energy",
        metrics=LAMMPS_METRICS,
        packages=LAMMPS_PACKAGES,
    )
)


register(
    SuiteKind(
        "bsp",
        _bsp,
        "hpcvm's bulk-synchronous microbenchmark (csrc/bsp.c): grains of work between "
        "allreduces on --np ranks, each step timed (what report --scale checks against)",
        metrics=BSP_METRICS,
        packages=("openmpi-bin",),
    )
)


def suite_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def kind_of(suite: str) -> SuiteKind | None:
    """The kind a stored suite name belongs to (None: a suite no longer registered)."""
    return next((k for k in REGISTRY.values() if k.stores(suite)), None)


def short_name(suite: str, metric: str) -> str | None:
    """The short label of a stored suite's metric, as its kind defines it."""
    kind = kind_of(suite)
    return kind.short_name(suite, metric) if kind is not None else None


def message_bytes(suite: str, metric: str) -> int | None:
    """The message size a stored suite's metric was measured at (its kind's
    ``Metric.message_bytes``); None for a metric without one or an unknown suite. The
    database stores no metric definitions, so the report asks the registry."""
    kind = kind_of(suite)
    if kind is None:
        return None
    return next((m.message_bytes for m in kind.metrics if m.name == metric), None)


def memory_bound(suite: str, metric: str) -> bool:
    """Whether a stored suite's metric is memory-bound (its kind's
    ``Metric.memory_bound``: STREAM, RandomAccess); False for an unknown one."""
    kind = kind_of(suite)
    return kind is not None and any(m.memory_bound for m in kind.metrics if m.name == metric)


def np_label(suite: str, metric: str, np: int) -> str | None:
    """A kind's own label for a metric at a process count, when it has one."""
    kind = kind_of(suite)
    if kind is None or kind.np_label is None:
        return None
    return kind.np_label(suite, metric, np)


def suite_packages() -> tuple[str, ...]:
    """Debian packages the registered suites run (their versions are recorded)."""
    return tuple(dict.fromkeys(p for k in REGISTRY.values() for p in k.packages))


def build_suites(names: Sequence[str], options: SuiteOptions) -> list[Suite]:
    """The suites for ``names`` (duplicates dropped, order kept), all constructed and
    therefore checked; UsageError naming an unknown suite and the known ones."""
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise UsageError(f"unknown suite {unknown[0]!r}: choose from {', '.join(REGISTRY)}")
    suites: list[Suite] = []
    for name in dict.fromkeys(names):
        suites.extend(REGISTRY[name].build(options))
    return suites


def validate_suites(suites: Sequence[Suite], np_values: Sequence[int]) -> None:
    """Every suite's own pre-flight check, in order (the first problem is reported)."""
    for suite in suites:
        suite.validate(np_values)
