"""Registry: suite name (as typed after ``--suite``) -> the suite kind it stands for
(bench/core/kind.py), and through it the suite objects of a run. Each built-in kind is
one package beside this module: its options in ``__init__`` (light, for ``--help``),
the suite and its ``KIND`` in ``suite.py``, registered below in one line.

Most names give one suite; ``npb`` gives one per kernel, in the class ``--size`` picks
(quick S, small W, medium A) or the class named (``cg.B``). Everything a user can get
wrong (unknown name, npb without a directory, cmd without a regex or direction, a bad
regex) is a UsageError here, before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcvm.bench.core.flags import SuiteFlag
from hpcvm.bench.core.kind import SuiteKind as SuiteKind  # re-exported: plugins register one
from hpcvm.bench.core.kind import SuiteOptions as SuiteOptions
from hpcvm.bench.core.suite import Suite
from hpcvm.bench.suites.bsp.suite import KIND as BSP
from hpcvm.bench.suites.cmd.suite import KIND as CMD
from hpcvm.bench.suites.hpcc.suite import KIND as HPCC
from hpcvm.bench.suites.lammps.suite import KIND as LAMMPS
from hpcvm.bench.suites.netpipe.suite import KIND as NETPIPE
from hpcvm.bench.suites.noise.suite import KIND as NOISE
from hpcvm.bench.suites.npb.suite import KIND as NPB
from hpcvm.bench.suites.openfoam.suite import KIND as OPENFOAM
from hpcvm.errors import UsageError
from hpcvm.registry import Registry

REGISTRY: Registry[SuiteKind] = Registry("suite")


def register(kind: SuiteKind) -> None:
    """Add a suite kind (hpcvm's own below, or a plugin's: see hpcvm/plugins.py). Its
    flags must not take another kind's option or key: two owners of ``--x`` would
    each read the other's value."""
    taken = {f.flag: k.name for k in REGISTRY.values() for f in k.flags}
    taken |= {f.key: k.name for k in REGISTRY.values() for f in k.flags}
    for flag in kind.flags:
        owner = taken.get(flag.flag) or taken.get(flag.key)
        if owner is not None and owner != kind.name:
            raise ValueError(f"suite {kind.name}: {flag.flag} ({flag.key}) is suite {owner}'s")
    REGISTRY.register(kind.name, kind)


# hpcvm's own suites, in the order --help lists them (bench/run/choices.py BUILTIN_SUITES)
for _kind in (HPCC, NOISE, NPB, NETPIPE, CMD, OPENFOAM, LAMMPS, BSP):
    register(_kind)


def registered_flags() -> dict[str, tuple[SuiteFlag, ...]]:
    """Every registered kind's options, by kind (the bench command's own are in cli/)."""
    return {name: kind.flags for name, kind in REGISTRY.items()}


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


def chosen(names: Sequence[str]) -> list[SuiteKind]:
    """The registered kinds of a run's suites, once each, in order."""
    return [REGISTRY[n] for n in dict.fromkeys(names) if n in REGISTRY]


def settled(names: Sequence[str], values: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """The flag values as each chosen kind records them (bench/core/kind.py ``settle``)."""
    for kind in chosen(names):
        if kind.settle is not None:
            values = kind.settle(values, cwd)
    return values


def guest_dirs(names: Sequence[str], options: SuiteOptions) -> list[Path]:
    """Host directories the chosen kinds' suites run from (a guest must see them)."""
    return [d for k in chosen(names) if k.guest_dirs is not None for d in k.guest_dirs(options)]


def calibrated(
    names: Sequence[str],
    options: SuiteOptions,
    recorded: SuiteOptions | None,
    first_pu: int | None,
) -> SuiteOptions:
    """The options with what each chosen kind calibrates once per run (or, resumed,
    takes as recorded)."""
    for kind in chosen(names):
        if kind.calibrate is not None:
            options = kind.calibrate(options, recorded, first_pu)
    return options


def derived_keys() -> set[str]:
    """Values a kind calibrates rather than the user chooses: not part of a run's
    identity (a resumed run takes the recorded ones)."""
    return {key for kind in REGISTRY.values() for key in kind.derived}
