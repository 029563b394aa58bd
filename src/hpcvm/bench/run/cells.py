"""What the measurement loop (runner.py, its records in recording.py) counts in: a cell
(one suite at one process count, in one environment) and the tally of each cell's
samples, values and cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcvm.bench.core.suite import Suite
from hpcvm.bench.results.failures import CellKey
from hpcvm.store import NewSample


@dataclass(frozen=True)
class Cell:
    """One suite at one process count (``np`` None: the suite ignores it)."""

    suite: Suite
    np: int | None

    @property
    def label(self) -> str:
        return self.suite.name if self.np is None else f"{self.suite.name} np={self.np}"


def cells_for(suites: Sequence[Suite], np_values: Sequence[int]) -> list[Cell]:
    cells: list[Cell] = []
    for suite in suites:
        if suite.uses_np:
            cells += [Cell(suite, n) for n in np_values]
        else:
            cells.append(Cell(suite, None))
    return cells


class Tally:
    """Per cell (env, suite, np): samples counted (measured and warm-up apart), the
    judged metrics' values in the order taken, and the seconds this process's measured
    samples took (what one more costs). Kept in memory, fed from the store once and
    then sample by sample, so the stopping rule never rereads the database."""

    def __init__(
        self,
        primary: Mapping[str, set[str]],
        envs: set[str],
        warmup_share: Mapping[str, float] | None = None,
    ) -> None:
        self.primary = primary
        self.envs = envs
        self.warmup_share = warmup_share or {}  # suite -> a warm-up's cost / a sample's
        self._counts: dict[tuple[CellKey, bool], int] = {}
        self._values: dict[CellKey, dict[str, list[float]]] = {}
        self._seconds: dict[CellKey, list[float]] = {}
        self._warmup_seconds: dict[CellKey, list[float]] = {}

    def add(self, sample: NewSample, seconds: float | None = None) -> None:
        if sample.env not in self.envs:
            return
        key = (sample.env, sample.suite, sample.np)
        self._counts[(key, sample.warmup)] = self.count(key, sample.warmup) + 1
        if seconds is not None:
            timed = self._warmup_seconds if sample.warmup else self._seconds
            timed.setdefault(key, []).append(seconds)
        if sample.warmup:
            return
        wanted = self.primary.get(sample.suite, set())
        for m in sample.metrics if sample.ok else ():
            if m.value is not None and m.metric in wanted:
                self._values.setdefault(key, {}).setdefault(m.metric, []).append(m.value)

    def count(self, key: CellKey, warmup: bool) -> int:
        return self._counts.get((key, warmup), 0)

    def most_reps(self) -> int:
        return max((n for (_, warm), n in self._counts.items() if not warm), default=0)

    def values(self, key: CellKey) -> dict[str, list[float]]:
        return self._values.get(key, {})

    def all_values(self) -> dict[CellKey, dict[str, list[float]]]:
        return self._values

    def cost(self, key: CellKey) -> float:
        """Mean seconds of the cell's measured samples in this process, else of its
        warm-ups scaled up to a sample (a smaller warm-up costs a share of one), 0 when
        none is timed yet."""
        taken = self._seconds.get(key)
        if taken:
            return sum(taken) / len(taken)
        warm = self._warmup_seconds.get(key)
        if not warm:
            return 0.0
        return sum(warm) / len(warm) / self.warmup_share.get(key[1], 1.0)
