"""What hpcvm knows about one kind of suite, in one place, so that adding a suite is its
module and one ``register`` line (bench/suites/registry.py), and the run's machinery
(bench/run/session.py, cli/bench_cmd.py) names no suite.

A kind owns:

- how its suites are built from the run's options (``build``), with its own options
  (``flags``, bench/core/flags.py) and its reading of ``--size``;
- what it is (``description``), its metrics and their short labels for figures, the
  Debian packages it runs (install hints, versions recorded with a run);
- the host directories its suites run from that a guest must see (``guest_dirs``);
- what it calibrates once per run on native's first PU (``calibrate``: noise's work
  quantum), recorded so that a resumed run takes the same (``derived`` keys, left out of
  the run's identity);
- what it records of the invoking process (``settle``: cmd keeps the directory the
  user was in, against which a relative ``--cmd`` is read).

``SuiteOptions`` holds the options every suite shares (``bind``, ``--size``) and each
kind's values by key; a kind reads its own back in a typed model (``typed``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, Field, model_validator

from hpcvm.bench.core.flags import SuiteFlag
from hpcvm.bench.core.launch import Bind
from hpcvm.errors import UsageError
from hpcvm.model import Frozen

if TYPE_CHECKING:
    from hpcvm.bench.core.metrics import Metric
    from hpcvm.bench.core.suite import Suite

M = TypeVar("M", bound=BaseModel)
SIZES = ("quick", "small", "medium")  # --size words; else a fraction of memory (hpcc, npb)


class SuiteOptions(Frozen):
    """Every suite's settings, as the ``bench`` command collects them (module doc)."""

    bind: Bind = "core"
    size: str = "small"  # --size as given: each kind reads it its own way
    values: dict[str, Any] = Field(default_factory=dict)  # kind flags' values, by key

    @model_validator(mode="before")
    @classmethod
    def _flat_keys_are_values(cls, data: Any) -> Any:
        """A kind's key given beside the shared ones (``SuiteOptions(noise_quanta=100)``,
        or a run recorded before kinds owned their options) is one of its values."""
        if not isinstance(data, dict):
            return data
        shared = {k: v for k, v in data.items() if k in ("bind", "size", "values")}
        rest = {k: v for k, v in data.items() if k not in shared}
        if not rest:
            return data
        return shared | {"values": {**shared.get("values", {}), **rest}}

    def typed(self, model: type[M]) -> M:
        """The values ``model`` has fields for (a kind's own), with bind and size."""
        fields = model.model_fields
        given = {"bind": self.bind, "size": self.size} | self.values
        return model.model_validate({k: v for k, v in given.items() if k in fields})

    def given(self, key: str) -> Any:
        """One kind value, None where it was not set."""
        return self.values.get(key)

    def with_values(self, **values: Any) -> SuiteOptions:
        return self.model_copy(update={"values": self.values | values})


def size_fraction(size: str) -> str | float:
    """``--size`` as given: one of the words, or else a fraction of memory (hpcc, npb);
    a one-line UsageError for anything else."""
    if size in SIZES:
        return size
    try:
        return float(size)
    except ValueError:
        raise UsageError(
            f"unknown --size {size!r}: use {', '.join(SIZES)} or a memory fraction like 0.05"
        ) from None


def word_size(options: SuiteOptions, key: str) -> str:
    """The size of a kind that takes a word only (netpipe, openfoam, lammps): as set
    under ``key`` (tests, a run recorded so), else ``--size``, a fraction read as small.
    The suite refuses a word it does not know."""
    given = options.given(key)
    if given is not None:
        return str(given)
    return options.size if options.size in SIZES else "small"


# (options, the recorded options of a resumed run or None, native's first PU or None)
Calibrate = Callable[[SuiteOptions, "SuiteOptions | None", "int | None"], SuiteOptions]


@dataclass(frozen=True)
class SuiteKind:
    """Everything hpcvm knows about one kind of suite (module doc). ``owns`` tells which
    stored suite names are of this kind (npb stores ``npb:cg.S``); ``label`` overrides the
    labels of ``metrics`` (NPB's depend on the kernel)."""

    name: str
    build: Callable[[SuiteOptions], list[Suite]]
    description: str
    metrics: tuple[Metric, ...] = ()
    packages: tuple[str, ...] = ()
    flags: tuple[SuiteFlag, ...] = ()
    guest_dirs: Callable[[SuiteOptions], list[Path]] | None = None
    calibrate: Calibrate | None = None
    derived: tuple[str, ...] = ()  # value keys calibrate fills: not part of the identity
    settle: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None
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
