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

import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hpcvm.bench.core.suite import Suite, WarmsUpSmaller
from hpcvm.bench.envs.environments import NATIVE, Environment
from hpcvm.bench.results.failures import CellKey
from hpcvm.bench.run.cells import Cell, Tally, cells_for
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.given_up import GivenUp
from hpcvm.bench.run.progress import Progress, ProgressSink
from hpcvm.bench.run.recording import Record
from hpcvm.bench.run.sampling import SampleSpot, take_sample
from hpcvm.bench.run.switching import Switch
from hpcvm.model import Frozen
from hpcvm.signals import raise_if_interrupted
from hpcvm.stats import StopDecision, fixed_width_stop, interleaved_order
from hpcvm.stats.stopping import projected_seconds
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
        self._stopped: dict[CellKey, StopDecision] = {}
        self._waiting: set[CellKey] = set()  # giving way to cells cheaper to finish
        self._nobody_waits = False  # this block, every open cell would give way
        self._all_failed: set[CellKey] = set()
        self._progress = Progress(
            progress,
            config=config,
            tally=self._tally,
            cells=self.cells,
            envs=list(self.envs),
            open_keys=self._open_keys,
            warmed_up=self._warmed.__contains__,
        )

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> Outcome:
        block = 0 if self.config.reps is not None else self._tally.most_reps()
        if self.config.reps is None:
            self._warm_up_all(block)
        while True:
            self._block(block)
            outcome = self._decide(block + 1)
            if outcome is not None:
                return outcome
            block += 1

    def _block(self, block: int) -> None:
        order = interleaved_order(list(self.envs), block, self.seed)
        self._refresh()
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
            self._judge(key)
            if spent + self._tally.cost(key) > pace:
                return

    def _open(self, env: str, cell: Cell, block: int) -> bool:
        """Whether the cell still runs: not given up; under a fixed --reps, its sample of
        this block not yet taken; under auto, not stopped by its own rule."""
        if not self._live(env, cell):
            return False
        if self.config.reps is not None:
            return not self._record.taken(env, cell, block, False)
        key = (env, cell.suite.name, cell.np)
        return key not in self._stopped and key not in self._waiting

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
        running = [k for k in self._open_keys() if k not in self._waiting]
        return max((self._tally.cost(k) for k in running), default=0.0)

    def _refresh(self) -> None:
        """Under auto, before each block: judge every open cell again (the time cap may
        have been reached, the cells it gave way to may have finished); when no cell
        that could still meet its target is left to give way to, none gives way, so
        the time left is still spent."""
        if self.config.reps is not None:
            return
        self._nobody_waits = False
        for key in self._open_keys():
            self._judge(key)
        # Giving way to a cell that is only taking its minimum gains nothing: those
        # samples are due anyway. Wait only while some cell can still meet its target.
        ahead = [
            k
            for k in self._open_keys()
            if k not in self._waiting and self._tally.count(k, False) >= self.config.min_reps
        ]
        if not ahead:
            self._waiting.clear()
            self._nobody_waits = True  # until the next block: all of them run, and fill

    def _live(self, env: str, cell: Cell) -> bool:
        """False once the cell's warm-up and first repetition failed the same way."""
        return self._given_up.live((env, cell.suite.name, cell.np))

    # -- stopping -----------------------------------------------------------------------

    def _judge(self, key: CellKey) -> None:
        """Under auto, after each of a cell's samples: stop the cell when its rule says
        so (a cell with no successful sample after the minimum stops as all-failed), or
        let it wait while cells cheaper to finish need the time left."""
        cfg = self.config
        n = self._tally.count(key, False)
        values = self._tally.values(key)
        if not values:
            if n >= cfg.min_reps:
                self._stopped[key] = StopDecision(
                    stop=True, reason="max-reps", n=n, worst_metric="", worst_relative_half_width=0
                )
                self._all_failed.add(key)
            return
        decision = fixed_width_stop(
            values,
            target=cfg.target,
            confidence=cfg.confidence,
            n_min=cfg.min_reps,
            n_max=cfg.max_reps,
            elapsed=self._record.elapsed(),
            max_time=cfg.max_time,
            reps=n,
            extreme=self.extreme.get(key[1], set()),
            seconds_per_rep=self._tally.cost(key) or None,
            reserved=self._reserved(key),
        )
        self._waiting.discard(key)
        # A native cell gives way only to native cells (_reserved): with none to wait
        # for, it spends the time even when its target lies beyond the cap.
        give_way = decision.give_way and (key[0] != NATIVE or self._reserved(key) > 0)
        if decision.stop:
            self._stopped[key] = decision
        elif (give_way or self._baseline_first(key)) and not self._nobody_waits:
            self._waiting.add(key)

    def _baseline_first(self, key: CellKey) -> bool:
        """Under a time cap, a VM cell past its minimum waits while a native cell is
        still open: native's interval is in every overhead (the ratio's interval is as
        wide as the wider of the two), so the time before the cap goes to native first;
        the VM cells fill what is left."""
        if self.config.max_time is None or key[0] == NATIVE:
            return False
        if self._tally.count(key, False) < self.config.min_reps:
            return False
        return any(k[0] == NATIVE and k not in self._waiting for k in self._open_keys())

    def _stopped_before_cap(self, key: CellKey) -> bool:
        """Under auto with a time cap: a repetition beyond the cell's minimum that would
        end past the cap (at what the cell's samples cost so far) is not started, and the
        cell stops there, as the cap would have stopped it after that sample. The cap
        then bounds the measuring instead of being overrun by up to a sample of every
        open cell (a TCG guest's hpcc sample is half a minute); the minimum is taken
        whatever the cap, so every cell still has its interval."""
        cfg = self.config
        if cfg.reps is not None or cfg.max_time is None:
            return False
        n, cost, values = (
            self._tally.count(key, False),
            self._tally.cost(key),
            self._tally.values(key),
        )
        if n < cfg.min_reps or not cost or not values:
            return False  # the minimum first; a cell with no value is _judge's to stop
        if self._record.elapsed() + cost <= cfg.max_time:
            return False
        self._stopped[key] = fixed_width_stop(
            values,
            target=cfg.target,
            confidence=cfg.confidence,
            n_min=cfg.min_reps,
            n_max=cfg.max_reps,
            elapsed=cfg.max_time,  # as the cap will be after one more sample
            max_time=cfg.max_time,
            reps=n,
            extreme=self.extreme.get(key[1], set()),
        )
        self._waiting.discard(key)
        return True

    def _projected(self, key: CellKey) -> float:
        """Seconds the cell still needs for its target (or its repetition cap)."""
        cost = self._tally.cost(key)
        if not cost or not self._tally.values(key):
            return math.inf
        return projected_seconds(
            self._tally.values(key),
            target=self.config.target,
            confidence=self.config.confidence,
            n=self._tally.count(key, False),
            n_max=self.config.max_reps,
            seconds_per_rep=cost,
            extreme=self.extreme.get(key[1], set()),
        )

    def _reserved(self, key: CellKey) -> float:
        """Time set aside for other open cells: under the time cap, native cells first
        (a VM cell reserves what every open native cell needs, a native cell nothing for
        VM cells), then, within each side, the cells that need less time to finish."""
        if self.config.max_time is None:
            return 0.0
        own = self._projected(key)
        native = key[0] == NATIVE
        reserved = 0.0
        for other in self._open_keys():
            if other == key or (native and other[0] != NATIVE):
                continue
            need = self._projected(other)
            if need < own or (other[0] == NATIVE and not native):
                reserved += need
        return reserved

    def _open_keys(self) -> list[CellKey]:
        return [
            (env, c.suite.name, c.np)
            for env in self.envs
            for c in self.cells
            if self._live(env, c) and (env, c.suite.name, c.np) not in self._stopped
        ]

    def _decide(self, reps: int) -> Outcome | None:
        cfg = self.config
        if cfg.reps is not None:
            if reps >= cfg.reps:
                return Outcome(
                    stop_reason="fixed",
                    detail=f"fixed --reps {cfg.reps}",
                    blocks=reps,
                    samples_run=self._record.ran,
                )
            return None
        keys = [(e, c.suite.name, c.np) for e in self.envs for c in self.cells]
        if any(k not in self._stopped and self._given_up.live(k) for k in keys):
            return None
        judged = [k for k in keys if k in self._stopped and k not in self._all_failed]
        blocks = self._tally.most_reps()
        if not judged:
            return Outcome(
                stop_reason="all-failed",
                detail=f"no successful sample after {blocks} repetitions",
                blocks=blocks,
                samples_run=self._record.ran,
            )
        reasons = {self._stopped[k].reason for k in judged}
        reason = next(r for r in ("max-time", "max-reps", "target") if r in reasons)
        return Outcome(
            stop_reason=reason,
            detail=self._detail(judged),
            blocks=blocks,
            samples_run=self._record.ran,
        )

    def _detail(self, judged: list[CellKey]) -> str:
        """Per cell: what stopped it, after how many repetitions, its widest interval;
        then the extreme statistics no cell judged."""
        target = self.config.target * 100
        parts = []
        for env, suite, np_ in judged:
            d = self._stopped[(env, suite, np_)]
            where = f"{env} {suite}" + ("" if np_ is None else f" np={np_}")
            parts.append(
                f"{where}: {d.reason} after {d.n} "
                f"(widest {d.worst_metric} ±{d.worst_relative_half_width * 100:.3g}%)"
            )
        text = f"target ±{target:g}% per cell; " + "; ".join(parts)
        left = sorted({m for k in judged for m in self._stopped[k].left_out})
        if left:
            text += f"; not judged (extreme statistics): {', '.join(left)}"
        return text

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
