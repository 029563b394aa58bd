"""The schedule: in which order the environments take their turns in each repetition
block, which repetition a cell's next sample is, which environments this process has
warmed up, and how long a cell's turn lasts.

In block k the environments run in the order ``stats.interleaved_order(envs, k, seed)``.
Cheap cells take several samples in their environment's turn, as many as fit in the
time the slowest open cell takes for one (the ``pace``), so that a native cell of two
seconds gets its thirty repetitions inside the same blocks as a guest cell of thirty
seconds gets its three. That is how interleaving stays fair: every block still visits
every environment with an open cell in a fresh random order, and each environment's
samples spread over the same stretch of time, instead of the cheap cells piling up after
the expensive ones stopped (where a drift of the machine would bias them). Repetitions
are numbered per cell under ``auto``, by block under a fixed ``--reps``.

Kept apart from the loop (runner.py) because a resumed run must recompute the same
schedule: it follows from the seed, the configuration and the cells' counts and costs
(the tally) alone, never from the clock or the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hpcvm.bench.results.failures import CellKey
from hpcvm.bench.run.cells import Cell, Tally
from hpcvm.bench.run.config import BenchConfig
from hpcvm.stats import interleaved_order


def cell_key(env: str, cell: Cell) -> CellKey:
    """The cell of ``cell`` in ``env``: (env, suite, np)."""
    return (env, cell.suite.name, cell.np)


class Schedule:
    """The schedule of one run over ``envs`` and ``cells`` (see module doc)."""

    def __init__(
        self,
        *,
        config: BenchConfig,
        seed: int,
        envs: Sequence[str],
        cells: Sequence[Cell],
        tally: Tally,
    ) -> None:
        self.config = config
        self.seed = seed
        self.envs = list(envs)
        self.cells = list(cells)
        self.tally = tally
        self.keys = [cell_key(env, c) for env in self.envs for c in self.cells]
        self._warmed: set[str] = set()

    @property
    def one_sample_per_turn(self) -> bool:
        """Under a fixed --reps, a cell's turn is one sample (that block's)."""
        return self.config.reps is not None

    def first_block(self) -> int:
        """0 under a fixed --reps; under auto the most repetitions a cell has stored
        (a resumed run goes on from there)."""
        return 0 if self.config.reps is not None else self.tally.most_reps()

    def order(self, block: int) -> list[str]:
        """The environments in the order they take their turns in ``block``."""
        return interleaved_order(self.envs, block, self.seed)

    def rep(self, key: CellKey, block: int, warmup: bool) -> int:
        """The repetition number of the cell's next sample: the block under a fixed
        --reps, the cell's own count under auto (cheap cells take several per block)."""
        if self.config.reps is not None:
            return block
        return self.tally.count(key, warmup)

    def pace(self, running: Iterable[CellKey]) -> float:
        """Seconds one sample of the slowest ``running`` cell takes (0 before any is
        timed): what every open cell may spend per turn under auto."""
        if self.config.reps is not None:
            return 0.0
        return max((self.tally.cost(k) for k in running), default=0.0)

    def turn_over(self, key: CellKey, spent: float, pace: float) -> bool:
        """Under auto: the cell's turn ends when one more sample (at what its samples
        cost so far) would not fit in ``pace`` beside the ``spent`` seconds."""
        return spent + self.tally.cost(key) > pace

    def warmed_up(self, env: str) -> bool:
        """Whether this process has taken the environment's warm-ups."""
        return env in self._warmed

    def mark_warmed_up(self, env: str) -> None:
        self._warmed.add(env)
