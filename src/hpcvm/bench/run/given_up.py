"""Failed samples while the loop (runner.py) runs: say at once that one failed and why,
and give a cell up when its warm-up and first repetition failed the same way (running it
again would only repeat the failure); say that too, and keep it in the run's warnings.

Kept apart from the stopping rule (stopping.py) because giving up is decided from the
stored samples' errors (``results.failures.repeats_same_failure``, the rule the results
and the report apply), not from any statistic: a resumed run reads the cells a previous
process gave up from the store and does not retry them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from hpcvm.bench.results.failures import CellKey, repeats_same_failure
from hpcvm.bench.run.recording import Record
from hpcvm.store import NewSample, SampleRecord


class GivenUp:
    """The cells given up in this run (``envs``: the environments this process runs)."""

    def __init__(
        self, record: Record, envs: Collection[str], notify: Callable[[str], None]
    ) -> None:
        self.record = record
        self.envs = envs
        self.notify = notify
        self._cells = self._stored()

    def live(self, key: CellKey) -> bool:
        """False once the cell's warm-up and first repetition failed the same way."""
        return key not in self._cells

    def failed(self, sample: NewSample, label: str) -> None:
        """Say at once that a sample failed and why; give the cell up when its first two
        samples failed the same way (say so, and keep it in the run's warnings)."""
        kind = "warm-up" if sample.warmup else f"rep {sample.repetition + 1}"
        self.notify(f"failed: {sample.env} {label} ({kind}): {sample.error}")
        key = (sample.env, sample.suite, sample.np)
        reason = repeats_same_failure(self._cell_samples(key))
        if reason is None or key in self._cells:
            return
        self._cells.add(key)
        text = (
            f"{sample.env}: {label}: not repeated, its warm-up and first repetition failed "
            f"the same way: {reason}"
        )
        self.record.warn(text, sample.env)
        self.notify(text)

    def _cell_samples(self, key: CellKey) -> list[SampleRecord]:
        return [
            s for s in self.record.samples() if (s.env, s.suite, s.np) == key and s.env in self.envs
        ]

    def _stored(self) -> set[CellKey]:
        """Cells a previous process gave up (a resumed run does not retry them); the
        stored samples are read once and grouped by cell."""
        by_cell: dict[CellKey, list[SampleRecord]] = {}
        for s in self.record.samples():
            if s.env in self.envs:
                by_cell.setdefault((s.env, s.suite, s.np), []).append(s)
        return {k for k, taken in by_cell.items() if repeats_same_failure(taken) is not None}
