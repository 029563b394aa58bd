"""When the measuring stops: the stopping policy the loop (runner.py) asks, cell by cell,
whether a cell still runs, and after each block whether the run is over.

A fixed ``--reps N`` runs one sample of every cell per block and stops after block N.
``auto`` decides per cell (environment x suite x np): after each of its samples,
``stats.fixed_width_stop`` judges that cell's metrics (extreme statistics left out) and
the cell stops on its own target, its repetition cap, or the run's time cap (a
repetition beyond its minimum that would end past the cap is not started). A cell
whose target (or cap) cannot fit in the time left beside what the cells cheaper to
finish still need waits for them (``give_way``), then spends what remains. Under a time
cap, a VM cell past its minimum also waits while a native cell is open: the native
interval is in every overhead, so native's repetitions come first.

Kept apart from the loop because it is a policy over numbers alone: each cell's values
and cost (the tally), the run's elapsed time and the configuration. It takes no sample,
writes nothing and chooses no order; the statistics themselves are ``stats/stopping.py``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from hpcvm.bench.envs.environments import NATIVE
from hpcvm.bench.results.failures import CellKey
from hpcvm.bench.run.cells import Tally
from hpcvm.bench.run.config import BenchConfig
from hpcvm.model import Frozen
from hpcvm.stats import StopDecision, fixed_width_stop
from hpcvm.stats.stopping import projected_seconds


class RunStop(Frozen):
    """Why the run stopped, in a word and in words, after how many blocks."""

    reason: str  # fixed, target, max-reps, max-time, all-failed
    detail: str
    blocks: int


class Stopping:
    """The stopping policy of one run. ``keys``: every cell, environment by environment;
    ``live``: whether a cell is not given up; ``elapsed``: the seconds the run has
    measured so far."""

    def __init__(
        self,
        *,
        config: BenchConfig,
        extreme: Mapping[str, set[str]],
        tally: Tally,
        keys: Sequence[CellKey],
        live: Callable[[CellKey], bool],
        elapsed: Callable[[], float],
    ) -> None:
        self.config = config
        self.extreme = extreme
        self.tally = tally
        self.keys = list(keys)
        self.live = live
        self.elapsed = elapsed
        self._stopped: dict[CellKey, StopDecision] = {}
        self._waiting: set[CellKey] = set()  # giving way to cells cheaper to finish
        self._nobody_waits = False  # this block, every open cell would give way
        self._all_failed: set[CellKey] = set()

    def open_keys(self) -> list[CellKey]:
        """The cells neither given up nor stopped (those waiting included)."""
        return [k for k in self.keys if self.live(k) and k not in self._stopped]

    def running(self) -> list[CellKey]:
        """The open cells not waiting for others."""
        return [k for k in self.open_keys() if k not in self._waiting]

    def goes_on(self, key: CellKey) -> bool:
        """Under auto: the cell is neither stopped by its own rule nor waiting."""
        return key not in self._stopped and key not in self._waiting

    def refresh(self) -> None:
        """Under auto, before each block: judge every open cell again (the time cap may
        have been reached, the cells it gave way to may have finished); when no cell
        that could still meet its target is left to give way to, none gives way, so
        the time left is still spent."""
        if self.config.reps is not None:
            return
        self._nobody_waits = False
        for key in self.open_keys():
            self.judge(key)
        # Giving way to a cell that is only taking its minimum gains nothing: those
        # samples are due anyway. Wait only while some cell can still meet its target.
        ahead = [
            k
            for k in self.open_keys()
            if k not in self._waiting and self.tally.count(k, False) >= self.config.min_reps
        ]
        if not ahead:
            self._waiting.clear()
            self._nobody_waits = True  # until the next block: all of them run, and fill

    def judge(self, key: CellKey) -> None:
        """Under auto, after each of a cell's samples: stop the cell when its rule says
        so (a cell with no successful sample after the minimum stops as all-failed), or
        let it wait while cells cheaper to finish need the time left."""
        cfg = self.config
        n = self.tally.count(key, False)
        values = self.tally.values(key)
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
            elapsed=self.elapsed(),
            max_time=cfg.max_time,
            reps=n,
            extreme=self.extreme.get(key[1], set()),
            seconds_per_rep=self.tally.cost(key) or None,
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
        if self.tally.count(key, False) < self.config.min_reps:
            return False
        return any(k[0] == NATIVE and k not in self._waiting for k in self.open_keys())

    def stopped_before_cap(self, key: CellKey) -> bool:
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
            self.tally.count(key, False),
            self.tally.cost(key),
            self.tally.values(key),
        )
        if n < cfg.min_reps or not cost or not values:
            return False  # the minimum first; a cell with no value is judge's to stop
        if self.elapsed() + cost <= cfg.max_time:
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
        cost = self.tally.cost(key)
        if not cost or not self.tally.values(key):
            return math.inf
        return projected_seconds(
            self.tally.values(key),
            target=self.config.target,
            confidence=self.config.confidence,
            n=self.tally.count(key, False),
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
        for other in self.open_keys():
            if other == key or (native and other[0] != NATIVE):
                continue
            need = self._projected(other)
            if need < own or (other[0] == NATIVE and not native):
                reserved += need
        return reserved

    def decide(self, reps: int) -> RunStop | None:
        """After a block (``reps`` blocks done): what stops the run, None while it goes
        on (under auto, while a cell is neither stopped nor given up)."""
        cfg = self.config
        if cfg.reps is not None:
            if reps >= cfg.reps:
                return RunStop(reason="fixed", detail=f"fixed --reps {cfg.reps}", blocks=reps)
            return None
        if any(k not in self._stopped and self.live(k) for k in self.keys):
            return None
        judged = [k for k in self.keys if k in self._stopped and k not in self._all_failed]
        blocks = self.tally.most_reps()
        if not judged:
            return RunStop(
                reason="all-failed",
                detail=f"no successful sample after {blocks} repetitions",
                blocks=blocks,
            )
        reasons = {self._stopped[k].reason for k in judged}
        reason = next(r for r in ("max-time", "max-reps", "target") if r in reasons)
        return RunStop(reason=reason, detail=self._detail(judged), blocks=blocks)

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
