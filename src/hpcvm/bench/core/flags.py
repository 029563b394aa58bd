"""The command-line options a suite kind owns, declared without pydantic or click so
that ``hpcvm bench --help`` reads them from a suite's light package (its
``__init__``) without importing the suite itself (bench/run/choices.py).

A flag's value is stored under ``key`` in ``SuiteOptions.values`` (bench/core/kind.py),
in the run's database with the rest of its configuration; the suite reads it back in
its typed options model. ``cli/bench_cmd.py`` turns every registered kind's flags into
click options and applies the rules here to every suite alike.
"""

from __future__ import annotations

from dataclasses import dataclass

Value = str | int | float | bool | None


@dataclass(frozen=True)
class SuiteFlag:
    """One option of ``hpcvm bench`` that belongs to one suite kind.

    ``selects``: given, it chooses its suite when the run names no ``--suite`` (``--cmd``,
    ``--npb-dir``), and it is refused beside a ``--suite`` list without its suite. A flag
    that does not select (``--noise-quanta``) is a setting: refused when set for a run
    whose suites lack its suite, never silently ignored. ``switch``: a flag without a
    value that stores ``switch`` (``--cmd-mpi``: True); two switches may share a key
    (``--lower-is-better``/``--higher-is-better``). ``positive``: values below 1 are
    refused."""

    flag: str  # "--noise-quanta"
    key: str  # "noise_quanta": where its value is stored; unique over all kinds
    help: str = ""
    kind: type[str] | type[int] | type[float] = str
    default: Value = None
    switch: Value = None
    selects: bool = False
    positive: bool = False
    show_default: bool = False

    @property
    def is_switch(self) -> bool:
        return self.switch is not None
