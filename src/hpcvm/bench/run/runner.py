"""The measurement loop: warm-ups, interleaved repetition blocks, stopping, one sample at
a time into the store.

Order (METHOD.md): in repetition block k the environments run in the order
``stats.interleaved_order(envs, k, seed)``; each environment, when its turn comes, is
resumed (every other VM is paused) and runs its cells (suite, np). Each process runs
one warm-up sample of each cell of an environment before measuring it (a suite with long
samples may run it on less data: hpcc's is an eighth of the matrix), recorded with the
warm-up flag and never summarised (a resumed run boots fresh VMs, so it warms up
again): under a fixed ``--reps`` at its first visit, under ``auto`` all of them first,
in the first block's order, so that block already knows what each cell costs.

A fixed ``--reps N`` runs one sample of every cell per block and stops after block N.
``auto`` decides per cell (environment x suite x np): after each of its samples,
``stats.fixed_width_stop`` judges that cell's metrics (extreme statistics left out) and
the cell stops on its own target, its repetition cap, or the run's time cap (a
repetition beyond its minimum that would end past the cap is not started). A cell
whose target (or cap) cannot fit in the time left beside what the cells cheaper to
finish still need waits for them (``give_way``), then spends what remains. Under a time
cap, a VM cell past its minimum also waits while a native cell is open: the native
interval is in every overhead, so native's repetitions come first.

Cheap cells take several samples in their environment's turn, as many as fit in the
time the slowest open cell takes for one, so that a native cell of two seconds gets
its thirty repetitions inside the same blocks as a guest cell of thirty seconds gets
its three. That is how interleaving stays fair: every block still visits every
environment with an open cell in a fresh random order, and each environment's samples
spread over the same stretch of time, instead of the cheap cells piling up after the
expensive ones stopped (where a drift of the machine would bias them). Repetitions are
numbered per cell.

Every sample, failed or not, is written at once with its log; a sample already in the
store (a resumed run) is skipped, so a resume recomputes the same schedule from the
seed and runs only what is missing (``auto`` counts each cell's stored samples and goes
on from there).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hpcvm.bench.core.suite import Suite, WarmsUpSmaller
from hpcvm.bench.envs.environments import Environment
from hpcvm.bench.results.failures import CellKey
from hpcvm.bench.run.cells import Cell, Tally, cells_for
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.given_up import GivenUp
from hpcvm.bench.run.progress import Progress, ProgressSink
from hpcvm.bench.run.recording import Record
from hpcvm.bench.run.sampling import SampleSpot, take_sample
from hpcvm.bench.run.stopping import Stopping
from hpcvm.bench.run.switching import Switch
from hpcvm.model import Frozen
from hpcvm.signals import raise_if_interrupted
from hpcvm.stats import interleaved_order
from hpcvm.store import Store

# ProgressSink lives in progress.py; named here too for session.py, which hands one in.
__all__ = ["Outcome", "ProgressSink", "Runner"]


class Outcome(Frozen):
    """How the loop ended."""

    stop_reason: str  # fixed, target, max-reps, max-time, all-failed
    detail: str
    blocks: int
    samples_run: int  # by this process


class Runner:
    """Runs one bench run's schedule against started environments (see module doc)."""

    def __init__(
        self,
        *,
        store: Store,
        run_id: int,
        seed: int,
        config: BenchConfig,
        envs: Mapping[str, Environment],
        suites: Sequence[Suite],
        out_dir: Path,
        sizing_memory: int,
        progress: ProgressSink | None = None,
        notify: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.seed = seed
        self.config = config
        self.envs = dict(envs)
        self.cells = cells_for(suites, config.np)
        self.primary = {s.name: {m.name for m in s.metrics} for s in suites}
        self.extreme = {s.name: {m.name for m in s.metrics if m.extreme} for s in suites}
        self.out_dir = out_dir.absolute()
        self.sizing_memory = sizing_memory
        self.clock = clock
        self._warmed: set[str] = set()
        self.notify = notify or (lambda _text: None)
        shares = {s.name: s.warmup_cost_share for s in suites if isinstance(s, WarmsUpSmaller)}
        self._tally = Tally(self.primary, set(self.envs), shares)
        self._record = Record(store, run_id, self._tally)
        self._given_up = GivenUp(self._record, set(self.envs), self.notify)
        self._switch = Switch(self.envs, self._record.warn)
        self._stopping = Stopping(
            config=config,
            extreme=self.extreme,
            tally=self._tally,
            keys=[(env, c.suite.name, c.np) for env in self.envs for c in self.cells],
            live=self._given_up.live,
            elapsed=self._record.elapsed,
        )
        self._progress = Progress(
            progress,
            config=config,
            tally=self._tally,
            cells=self.cells,
            envs=list(self.envs),
            open_keys=self._stopping.open_keys,
            warmed_up=self._warmed.__contains__,
        )

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> Outcome:
        block = 0 if self.config.reps is not None else self._tally.most_reps()
        if self.config.reps is None:
            self._warm_up_all(block)
        while True:
            self._block(block)
            stop = self._stopping.decide(block + 1)
            if stop is not None:
                return Outcome(
                    stop_reason=stop.reason,
                    detail=stop.detail,
                    blocks=stop.blocks,
                    samples_run=self._record.ran,
                )
            block += 1

    def _block(self, block: int) -> None:
        order = interleaved_order(list(self.envs), block, self.seed)
        self._stopping.refresh()
        pace = self._pace()
        for position, name in enumerate(order):
            pending = [c for c in self.cells if self._open(name, c, block)]
            if not pending:
                continue
            self._switch.to(name)
            self._warm_up(name, pending, block, position)
            for cell in pending:
                self._turn(name, cell, block, position, pace)

    def _warm_up(self, name: str, pending: list[Cell], block: int, position: int) -> None:
        """The environment's warm-up samples, the first time this process visits it."""
        if name in self._warmed:
            return
        for cell in pending:
            rep = self._rep(name, cell, block, True)
            if not self._record.taken(name, cell, rep, True):
                self._sample(name, cell, rep, position, warmup=True)
        self._warmed.add(name)

    def _warm_up_all(self, block: int) -> None:
        """Under auto, every environment's warm-ups before the first block (in that
        block's order), so that the first block already knows what a sample of each
        cell costs and the cheap cells fill it: with the time cap reached early (a slow
        or busy machine), the first block may be all they get."""
        for position, name in enumerate(interleaved_order(list(self.envs), block, self.seed)):
            pending = [c for c in self.cells if self._live(name, c)]
            if pending:
                self._switch.to(name)
                self._warm_up(name, pending, block, position)

    def _turn(self, name: str, cell: Cell, block: int, position: int, pace: float) -> None:
        """One cell's part of an environment's turn: one sample under a fixed --reps;
        under auto, samples until the cell stops or another would not fit in ``pace``
        seconds (so the slowest cell takes one, however its warm-up went)."""
        key = (name, cell.suite.name, cell.np)
        spent = 0.0
        while self._open(name, cell, block) and not self._stopped_before_cap(key):
            spent += self._sample(name, cell, self._rep(name, cell, block, False), position)
            if self.config.reps is not None:
                return
            self._stopping.judge(key)
            if spent + self._tally.cost(key) > pace:
                return

    def _open(self, env: str, cell: Cell, block: int) -> bool:
        """Whether the cell still runs: not given up; under a fixed --reps, its sample of
        this block not yet taken; under auto, not stopped by its own rule."""
        if not self._live(env, cell):
            return False
        if self.config.reps is not None:
            return not self._record.taken(env, cell, block, False)
        return self._stopping.goes_on((env, cell.suite.name, cell.np))

    def _rep(self, env: str, cell: Cell, block: int, warmup: bool) -> int:
        """The repetition number of the cell's next sample: the block under a fixed
        --reps, the cell's own count under auto (cheap cells take several per block)."""
        if self.config.reps is not None:
            return block
        return self._tally.count((env, cell.suite.name, cell.np), warmup)

    def _pace(self) -> float:
        """Seconds one sample of the slowest open cell takes (0 before any is timed):
        what every open cell may spend per turn under auto."""
        if self.config.reps is not None:
            return 0.0
        return max((self._tally.cost(k) for k in self._stopping.running()), default=0.0)

    def _live(self, env: str, cell: Cell) -> bool:
        """False once the cell's warm-up and first repetition failed the same way."""
        return self._given_up.live((env, cell.suite.name, cell.np))

    def _stopped_before_cap(self, key: CellKey) -> bool:
        """The stopping policy's word on starting one more sample of the cell (a seam
        benchmarks/main_job_replay.py replaces to replay the loop as it was)."""
        return self._stopping.stopped_before_cap(key)

    def values_by_metric(self) -> dict[str, list[float]]:
        """Values of every suite's main metrics per (env, suite, np) from the store, in
        the order taken (per-CPU details are left out)."""
        values: dict[str, list[float]] = {}
        for (env, suite, np_), by_metric in self._tally.all_values().items():
            np_text = "-" if np_ is None else str(np_)
            for metric, taken in by_metric.items():
                values[f"{env} {suite} np={np_text} {metric}"] = list(taken)
        return values

    # -- one sample ---------------------------------------------------------------------

    def _sample(
        self, env_name: str, cell: Cell, block: int, position: int, *, warmup: bool = False
    ) -> float:
        """Run, record and log one sample (``block``: its repetition number); return the
        seconds it took."""
        raise_if_interrupted()  # a Ctrl-C swallowed during the last sample stops here
        self._progress.starting(len(self._record.done), env_name, cell, block, warmup)
        started = self.clock()
        sample = take_sample(
            self.envs[env_name],
            SampleSpot(env_name, cell, block, warmup, position, self.out_dir),
            timeout=self.config.timeout,
            sizing_memory=self.sizing_memory,
        )
        self._record.write(sample)
        seconds = self.clock() - started  # the sample's row written: it costs its write too
        self._record.count(sample, seconds)
        if sample.error is not None:
            self._given_up.failed(sample, cell.label)
        return seconds
