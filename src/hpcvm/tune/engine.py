"""Check, apply (all or nothing) and revert (exactly) the registry's settings.

Apply, in order: refuse if a saved state exists (its values are the host's originals
and must not be overwritten by tuned ones); work out every change from the live files
before writing anything; then for each change save it to the state file, and only then
write it. If a write fails, the changes already written are restored in reverse order
and the state file is removed, so the host is as it was. Revert restores the saved
values in reverse order and reads each file back: it must hold exactly the text it
held before apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hpcvm.errors import UsageError
from hpcvm.tune import files, state
from hpcvm.tune.errors import TuneError
from hpcvm.tune.model import Change, Row, SavedState, TuneTarget
from hpcvm.tune.registry import REGISTRY
from hpcvm.tune.settings.base import Setting


@dataclass
class ApplyResult:
    """What apply did (or, with dry_run, would do)."""

    changes: list[Change] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # paths the kernel refused (EIO, EPERM)


@dataclass
class RevertResult:
    """What revert restored; ``gone``: files that vanished meanwhile (an IRQ removed)."""

    state: SavedState | None
    restored: list[Change] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)


def check(target: TuneTarget, registry: dict[str, Setting] | None = None) -> list[Row]:
    """One row per setting, in registry order."""
    return [s.check(target) for s in (registry or REGISTRY).values()]


def planned_changes(target: TuneTarget, registry: dict[str, Setting] | None = None) -> list[Change]:
    """Every write apply would do, worked out before any is done."""
    return [c for s in (registry or REGISTRY).values() for c in s.changes(target)]


def apply(
    target: TuneTarget,
    directory: Path,
    *,
    registry: dict[str, Setting] | None = None,
    dry_run: bool = False,
) -> ApplyResult:
    """Make the host match ``target``; all or nothing (see the module doc)."""
    changes = planned_changes(target, registry)
    if dry_run:
        return ApplyResult(changes=changes)
    with state.locked(directory):
        saved = state.load(directory)
        if saved is not None:
            raise UsageError(
                f"tuning for {saved.target.source} is already applied (saved "
                f"{saved.started} in {directory}): run `hpcvm tune --revert` first"
            )
        other = state.applied_elsewhere(directory)
        if other is not None:
            raise UsageError(
                f"this host's tuning is already applied from state dir {other}: revert it "
                f"there first (`hpcvm tune --revert --state-dir {other}`)"
            )
        if not changes:
            return ApplyResult()
        return _apply_locked(target, directory, changes)


def _apply_locked(target: TuneTarget, directory: Path, changes: list[Change]) -> ApplyResult:
    current = state.new_state(target)
    state.save(directory, current)
    state.claim_host(directory)  # before any write: a crash midway still names this dir
    done: list[Change] = []
    refused: list[str] = []
    for change in changes:
        current = current.model_copy(update={"changes": (*current.changes, change)})
        state.save(directory, current)
        try:
            files.write(change.path, change.value, may_refuse=change.may_refuse)
        except files.Refused:
            refused.append(change.path)
            current = current.model_copy(
                update={"changes": current.changes[:-1], "refused": (*current.refused, change.path)}
            )
            state.save(directory, current)
            continue
        except (TuneError, OSError) as exc:
            _roll_back(directory, [*done, change], exc)
        except BaseException:  # Ctrl-C midway: undo, then let it end the command
            _restore([*done, change])
            state.remove(directory)
            raise
        done.append(change)
    state.save(directory, current.model_copy(update={"complete": True}))
    return ApplyResult(changes=done, refused=refused)


def _roll_back(directory: Path, written: list[Change], cause: Exception) -> None:
    """Restore ``written`` (the last may not have been written: restoring it rewrites
    the value it holds) and raise TuneError; keep the state file if any restore fails."""
    failed = _restore(written)[1]
    if failed:
        raise TuneError(
            f"{cause}; rolling back also failed for {', '.join(failed)}: the saved values are "
            f"in {directory / state.STATE_FILE}, run `hpcvm tune --revert` as root"
        ) from cause
    state.remove(directory)
    raise TuneError(
        f"{cause}; nothing is left changed: the {len(written) - 1} earlier writes were rolled back"
    ) from cause


def _restore(changes: list[Change]) -> tuple[list[str], list[str]]:
    """Write back each change's original value, last first, and read it back.
    Returns (paths gone, failures as 'path: why')."""
    gone: list[str] = []
    failed: list[str] = []
    for change in reversed(changes):
        now = files.read(change.path)
        if now is None:
            gone.append(change.path)
            continue
        if now == change.before:  # never written, or put back already: nothing to do
            continue
        try:
            files.write(change.path, change.restore)
        except (TuneError, files.Refused) as exc:
            failed.append(f"{change.path}: {exc}")
            continue
        after = files.read(change.path)
        if after != change.before:
            failed.append(f"{change.path}: holds {after!r}, not {change.before!r}")
    return gone, failed


def revert(directory: Path) -> RevertResult:
    """Restore what the saved state lists; remove it when every file holds its old text."""
    with state.locked(directory):
        saved = state.load(directory)
        if saved is None:
            return RevertResult(state=None)
        changes = list(saved.changes)
        gone, failed = _restore(changes)
        if failed:
            raise TuneError(
                f"could not restore {'; '.join(failed)}: the saved values stay in "
                f"{directory / state.STATE_FILE}; fix the cause and run `hpcvm tune --revert` again"
            )
        state.remove(directory)
        restored = [c for c in changes if c.path not in gone]
        return RevertResult(state=saved, restored=restored, gone=gone)


def saved_state(directory: Path) -> SavedState | None:
    """The saved state without taking the lock (for --check and snapshots)."""
    return state.load(directory)
