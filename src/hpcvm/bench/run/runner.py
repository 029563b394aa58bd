"""The measurement loop: warm-ups, interleaved repetition blocks, one sample at a time,
until the stopping policy ends the run. The loop ties together what the modules beside
it own, each apart for its own reason:

- ``schedule.py``: the order of the environments in each block, repetition numbers,
  which environments are warmed up, how long a cell's turn lasts;
- ``stopping.py``: when a cell has enough (a fixed ``--reps``, or ``auto``'s rule per
  cell, its caps and the time cap) and what ended the run;
- ``recording.py``: every sample into the store at once, what is done, the tally;
- ``given_up.py``: failed samples said at once, a cell that fails the same way twice
  given up;
- ``switching.py``: every other environment paused while one runs;
- ``progress.py``: what the person watching is told before each sample;
- ``sampling.py``: one sample itself.

Order (METHOD.md): in repetition block k the environments run in the order
``stats.interleaved_order(envs, k, seed)``; each environment, when its turn comes, is
resumed (every other VM is paused) and runs its cells (suite, np). Each process runs
one warm-up sample of each cell of an environment before measuring it (a suite with long
samples may run it on less data: hpcc's is an eighth of the matrix), recorded with the
warm-up flag and never summarised (a resumed run boots fresh VMs, so it warms up
again): under a fixed ``--reps`` at its first visit, under ``auto`` all of them first,
in the first block's order, so that block already knows what each cell costs. Under a
fixed ``--reps`` a cell's turn is one sample; under ``auto`` a cell takes samples in its
turn until it stops or the turn's time (the schedule's pace) is spent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hpcvm.bench.core.suite import Suite, WarmsUpSmaller
from hpcvm.bench.envs.environments import Environment
from hpcvm.bench.run.cells import Cell, Tally, cells_for
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.given_up import GivenUp
from hpcvm.bench.run.progress import Progress, ProgressSink
from hpcvm.bench.run.recording import Record
from hpcvm.bench.run.sampling import SampleSpot, take_sample
from hpcvm.bench.run.schedule import Schedule, cell_key
from hpcvm.bench.run.stopping import Stopping
from hpcvm.bench.run.switching import Switch
from hpcvm.model import Frozen
from hpcvm.signals import raise_if_interrupted
from hpcvm.store import Store


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
        self.out_dir = out_dir.absolute()
        self.sizing_memory = sizing_memory
        self.clock = clock
        self.notify = notify or (lambda _text: None)
        primary = {s.name: {m.name for m in s.metrics} for s in suites}
        extreme = {s.name: {m.name for m in s.metrics if m.extreme} for s in suites}
        shares = {s.name: s.warmup_cost_share for s in suites if isinstance(s, WarmsUpSmaller)}
        self._tally = Tally(primary, set(self.envs), shares)
        self._record = Record(store, run_id, self._tally)
        self._given_up = GivenUp(self._record, set(self.envs), self.notify)
        self._switch = Switch(self.envs, self._record.warn)
        self._schedule = Schedule(
            config=config, seed=seed, envs=list(self.envs), cells=self.cells, tally=self._tally
        )
        self._stopping = Stopping(
            config=config,
            extreme=extreme,
            tally=self._tally,
            keys=self._schedule.keys,
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
            warmed_up=self._schedule.warmed_up,
        )

    def run(self) -> Outcome:
        block = self._schedule.first_block()
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

    def values_by_metric(self) -> dict[str, list[float]]:
        """Values of every suite's main metrics per (env, suite, np) from the store, in
        the order taken (per-CPU details are left out)."""
        values: dict[str, list[float]] = {}
        for (env, suite, np_), by_metric in self._tally.all_values().items():
            np_text = "-" if np_ is None else str(np_)
            for metric, taken in by_metric.items():
                values[f"{env} {suite} np={np_text} {metric}"] = list(taken)
        return values

    def _block(self, block: int) -> None:
        order = self._schedule.order(block)
        self._stopping.refresh()
        pace = self._schedule.pace(self._stopping.running())
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
        if self._schedule.warmed_up(name):
            return
        for cell in pending:
            rep = self._schedule.rep(cell_key(name, cell), block, True)
            if not self._record.taken(name, cell, rep, True):
                self._sample(name, cell, rep, position, warmup=True)
        self._schedule.mark_warmed_up(name)

    def _warm_up_all(self, block: int) -> None:
        """Under auto, every environment's warm-ups before the first block (in that
        block's order), so that the first block already knows what a sample of each
        cell costs and the cheap cells fill it: with the time cap reached early (a slow
        or busy machine), the first block may be all they get."""
        for position, name in enumerate(self._schedule.order(block)):
            pending = [c for c in self.cells if self._given_up.live(cell_key(name, c))]
            if pending:
                self._switch.to(name)
                self._warm_up(name, pending, block, position)

    def _turn(self, name: str, cell: Cell, block: int, position: int, pace: float) -> None:
        """One cell's part of an environment's turn: one sample under a fixed --reps;
        under auto, samples until the cell stops or another would not fit in ``pace``
        seconds (so the slowest cell takes one, however its warm-up went)."""
        key = cell_key(name, cell)
        spent = 0.0
        while self._open(name, cell, block) and not self._stopping.stopped_before_cap(key):
            spent += self._sample(name, cell, self._schedule.rep(key, block, False), position)
            if self._schedule.one_sample_per_turn:
                return
            self._stopping.judge(key)
            if self._schedule.turn_over(key, spent, pace):
                return

    def _open(self, env: str, cell: Cell, block: int) -> bool:
        """Whether the cell still runs: not given up; under a fixed --reps, its sample of
        this block not yet taken; under auto, not stopped by its own rule."""
        key = cell_key(env, cell)
        if not self._given_up.live(key):
            return False
        if self.config.reps is not None:
            return not self._record.taken(env, cell, block, False)
        return self._stopping.goes_on(key)

    def _sample(
        self, env_name: str, cell: Cell, rep: int, position: int, *, warmup: bool = False
    ) -> float:
        """Run, record and log one sample (``rep``: its repetition number); return the
        seconds it took."""
        raise_if_interrupted()  # a Ctrl-C swallowed during the last sample stops here
        self._progress.starting(len(self._record.done), env_name, cell, rep, warmup)
        started = self.clock()
        sample = take_sample(
            self.envs[env_name],
            SampleSpot(env_name, cell, rep, warmup, position, self.out_dir),
            timeout=self.config.timeout,
            sizing_memory=self.sizing_memory,
        )
        self._record.write(sample)
        seconds = self.clock() - started  # the sample's row written: it costs its write too
        self._record.count(sample, seconds)
        if sample.error is not None:
            self._given_up.failed(sample, cell.label)
        return seconds
