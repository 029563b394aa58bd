"""Failed samples, counted where a person looks: per environment, suite and np.

A failed sample is kept in the store with its reason and log; these functions turn the
samples into what the table, ``results``, the report and the exit code need: how many
samples of a cell failed, how many were valid, the most frequent reason, and whether the
cell was given up because its warm-up and first repetition failed the same way (running
it again would only repeat the same failure). Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from hpcvm.model import Frozen
from hpcvm.store import SampleRecord

CellKey = tuple[str, str, int | None]  # env, suite, np
NO_REASON = "no reason recorded"


class CellFailures(Frozen):
    """The failures of one environment x suite x np (warm-ups included in ``samples``
    and ``failed``, since a failing warm-up is as telling as a failing repetition)."""

    env: str
    suite: str
    np: int | None
    samples: int  # every sample taken, warm-ups included
    failed: int
    valid: int  # measured (non-warm-up) samples that succeeded: what the summary uses
    reason: str  # the most frequent reason
    reason_count: int
    given_up: bool  # warm-up and first repetition failed the same way: not repeated
    logs: tuple[str, ...]

    @property
    def where(self) -> str:
        np_text = "" if self.np is None else f" np={self.np}"
        return f"{self.env} {self.suite}{np_text}"


def _by_cell(samples: Iterable[SampleRecord]) -> dict[CellKey, list[SampleRecord]]:
    cells: dict[CellKey, list[SampleRecord]] = defaultdict(list)
    for s in samples:
        cells[(s.env, s.suite, s.np)].append(s)
    return cells


def repeats_same_failure(taken: Sequence[SampleRecord]) -> str | None:
    """The reason when the first two samples of a cell (its warm-up and first
    repetition, in the order taken) failed the same way and none succeeded; else None."""
    ordered = sorted(taken, key=lambda s: s.id)
    if len(ordered) < 2 or any(s.ok for s in ordered):
        return None
    first, second = ordered[0], ordered[1]
    return first.error if first.error and first.error == second.error else None


def cell_failures(samples: Sequence[SampleRecord]) -> list[CellFailures]:
    """One entry per cell with at least one failed sample, in the order first taken."""
    out: list[CellFailures] = []
    for (env, suite, np_), taken in _by_cell(samples).items():
        bad = [s for s in taken if not s.ok]
        if not bad:
            continue
        reason, count = Counter(s.error or NO_REASON for s in bad).most_common(1)[0]
        out.append(
            CellFailures(
                env=env,
                suite=suite,
                np=np_,
                samples=len(taken),
                failed=len(bad),
                valid=sum(1 for s in taken if s.ok and not s.warmup),
                reason=reason,
                reason_count=count,
                given_up=repeats_same_failure(taken) is not None,
                logs=tuple(s.log_path for s in bad if s.log_path),
            )
        )
    return out


def without_valid_sample(samples: Sequence[SampleRecord]) -> list[tuple[str, str]]:
    """(environment, suite) pairs that were run but have no valid measured sample at any
    np: a run that leaves one has not measured what it was asked to."""
    valid: dict[tuple[str, str], int] = {}
    for s in samples:
        pair = (s.env, s.suite)
        valid[pair] = valid.get(pair, 0) + (1 if s.ok and not s.warmup else 0)
    return [pair for pair, n in valid.items() if n == 0]


def failure_line(f: CellFailures) -> str:
    """One line for a person: where, how many, and the most frequent reason."""
    share = "" if f.reason_count == f.failed else f" ({f.reason_count} of them)"
    gave_up = "; not repeated: warm-up and first repetition failed the same way" * f.given_up
    return f"{f.where}: {f.failed} of {f.samples} samples failed{gave_up}: {f.reason}{share}"
