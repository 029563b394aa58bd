"""Registry: suite name (as typed after ``--suite``) -> the suite objects it stands for.

Most names give one suite; ``npb`` gives one per kernel, in the class ``--size`` picks
(quick S, small W, medium A) or the class named (``cg.B``). Everything a user can get
wrong (unknown name, npb without a directory, cmd without a regex or direction, a bad
regex) is a UsageError here, before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from hpcvm.bench.cmd import CmdSuite
from hpcvm.bench.hpcc import HpccSize, HpccSuite
from hpcvm.bench.launch import Bind
from hpcvm.bench.noise import NoiseSuite
from hpcvm.bench.npb import discover
from hpcvm.bench.suite import Suite
from hpcvm.errors import UsageError
from hpcvm.model import Frozen


class SuiteOptions(Frozen):
    """Every suite's settings, as the ``bench`` command collects them from its options."""

    bind: Bind = "core"
    hpcc_size: HpccSize = "small"
    noise_quanta: int = 20000
    noise_quantum_us: int = 50
    noise_iterations: int | None = None  # one quantum's work, fixed once per bench run
    npb_dir: Path | None = None
    npb_kernels: tuple[str, ...] = ()
    npb_size: str | float = "small"  # --size as given: picks one NPB class per kernel
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


REGISTRY: dict[str, Callable[[SuiteOptions], list[Suite]]] = {
    "hpcc": _hpcc,
    "noise": _noise,
    "npb": _npb,
    "cmd": _cmd,
}


def suite_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def build_suites(names: Sequence[str], options: SuiteOptions) -> list[Suite]:
    """The suites for ``names`` (duplicates dropped, order kept), all constructed and
    therefore checked; UsageError naming an unknown suite and the known ones."""
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise UsageError(f"unknown suite {unknown[0]!r}: choose from {', '.join(REGISTRY)}")
    suites: list[Suite] = []
    for name in dict.fromkeys(names):
        suites.extend(REGISTRY[name](options))
    return suites


def validate_suites(suites: Sequence[Suite], np_values: Sequence[int]) -> None:
    """Every suite's own pre-flight check, in order (the first problem is reported)."""
    for suite in suites:
        suite.validate(np_values)
