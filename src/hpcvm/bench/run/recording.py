"""Storage for the loop (runner.py): every sample, failed or not, is written to the store
at once with its log, its seconds added to the run's elapsed time, and counted in the
cells' tally.

Kept apart because the store is the run's memory across processes: a sample already in
it (a resumed run) is skipped, so a resume recomputes the same schedule from the seed and
runs only what is missing, and under ``auto`` each cell's count goes on from its stored
samples (the tally is fed from the store once, then sample by sample here). The elapsed
time the time cap is judged on is the stored one, so it too survives a resume.
"""

from __future__ import annotations

from hpcvm.bench.run.cells import Cell, Tally
from hpcvm.store import NewSample, SampleKey, SampleRecord, Store


class Record:
    """One run's samples in the store, and the tally fed from them."""

    def __init__(self, store: Store, run_id: int, tally: Tally) -> None:
        self.store = store
        self.run_id = run_id
        self.tally = tally
        self.done = store.completed(run_id)
        self.ran = 0  # samples taken by this process
        for stored in store.samples(run_id):
            tally.add(stored)

    def taken(self, env: str, cell: Cell, rep: int, warmup: bool) -> bool:
        """Whether that sample is in the store already (by this process or before)."""
        key = SampleKey(env=env, suite=cell.suite.name, np=cell.np, repetition=rep, warmup=warmup)
        return key in self.done

    def write(self, sample: NewSample) -> None:
        """Store the sample (with its log's path), at once."""
        self.store.add_sample(self.run_id, sample)

    def count(self, sample: NewSample, seconds: float) -> None:
        """Count the written sample: its seconds in the run's elapsed time, its key as
        done, its values and cost in the tally."""
        self.store.add_elapsed(self.run_id, seconds)
        self.done.add(sample.key)
        self.tally.add(sample, seconds)
        self.ran += 1

    def elapsed(self) -> float:
        """Seconds the run has measured so far, every process together."""
        return self.store.run(self.run_id).elapsed_s

    def samples(self) -> list[SampleRecord]:
        return self.store.samples(self.run_id)

    def warn(self, text: str, env: str) -> None:
        """Keep ``text`` in the run's warnings, as about ``env``."""
        self.store.add_warning(self.run_id, text, env=env)
