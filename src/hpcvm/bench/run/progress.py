"""Progress for the person watching a run: before each sample the loop (runner.py) tells a
``ProgressSink`` how many samples are done, how many it expects in all, and which one
starts.

Kept apart from the loop because the total is a guess made for the person alone: under a
fixed ``--reps`` it is known, under ``auto`` it is what is done plus a sample of every
open cell (its minimum while it has not reached it) and the warm-ups still to come, so it
grows as cells go on. Nothing the loop decides may depend on it; this module reads the
loop's state and never changes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from hpcvm.bench.results.failures import CellKey
from hpcvm.bench.run.cells import Cell, Tally
from hpcvm.bench.run.config import BenchConfig


class ProgressSink(Protocol):
    """Told before each sample starts; ``total`` is an estimate under ``auto``."""

    def update(self, done: int, total: int, label: str) -> None: ...


class Quiet:
    """A sink that shows nothing (no one is watching)."""

    def update(self, done: int, total: int, label: str) -> None:
        return None


class Progress:
    """Tells the sink about each sample as it starts, with the total as well as it is
    known then. ``open_keys``: the cells still running; ``warmed_up``: whether this
    process has taken an environment's warm-ups."""

    def __init__(
        self,
        sink: ProgressSink | None,
        *,
        config: BenchConfig,
        tally: Tally,
        cells: Sequence[Cell],
        envs: Sequence[str],
        open_keys: Callable[[], list[CellKey]],
        warmed_up: Callable[[str], bool],
    ) -> None:
        self.sink: ProgressSink = sink or Quiet()
        self.config = config
        self.tally = tally
        self.cells = list(cells)
        self.envs = list(envs)
        self.open_keys = open_keys
        self.warmed_up = warmed_up

    def starting(self, done: int, env: str, cell: Cell, rep: int, warmup: bool) -> None:
        """The sample of ``cell`` in ``env`` (``rep``: its repetition number) starts,
        ``done`` samples into the run."""
        if self.config.reps is None:
            total = max(self._auto_estimate(done), done + 1)
        else:
            total = max(self._total_estimate(self.config.reps), done + 1)
        kind = "warm-up" if warmup else f"rep {rep + 1}"
        self.sink.update(done, total, f"{env} {cell.label} ({kind})")

    def _total_estimate(self, blocks: int) -> int:
        per_block = len(self.cells) * len(self.envs)
        return per_block * (blocks + 1)

    def _auto_estimate(self, done: int) -> int:
        """Under auto: what is done, plus a sample of every open cell (its minimum when
        it has not reached it) and the warm-ups still to come; it grows as cells go on."""
        left = sum(
            max(self.config.min_reps - self.tally.count(k, False), 1) for k in self.open_keys()
        )
        warmups = sum(len(self.cells) for env in self.envs if not self.warmed_up(env))
        return done + left + warmups
