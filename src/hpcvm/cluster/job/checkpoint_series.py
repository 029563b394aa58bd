"""A series of job checkpoints: one directory holding a job's checkpoints as
``checkpoint-000001``, ``checkpoint-000002``, ... (``cluster up --checkpoint-every
--checkpoint-dir``, ``cluster checkpoint --series``). Each member is written aside and
renamed when complete (cluster/commands/checkpoint.py), so a member without its manifest is one
being written, or one a dead writer left; the newest complete member is the job's last
good state, which ``cluster up --restore SERIES`` restores.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from hpcvm.cluster.job.checkpoint_model import MANIFEST
from hpcvm.errors import UsageError
from hpcvm.runtime.checkpoint import directory as checkpoint_dir

PREFIX = "checkpoint-"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


def prepare(directory: Path, *, make: bool = True) -> Path:
    """The series directory, absolute, made (0700) if missing (unless not ``make``: a
    check before anything starts); refused in one line when it cannot hold checkpoints:
    not a directory, not writable, where other users could swap files, or a single job
    checkpoint itself."""
    series = directory.absolute()
    try:
        series.lstat()
    except FileNotFoundError:
        pass
    except OSError as exc:  # under a directory this user may not enter
        raise UsageError(
            f"--checkpoint-dir {series} cannot be reached ({os.strerror(exc.errno or 0)}): "
            "give a directory you may write in"
        ) from None
    if not series.exists():
        checkpoint_dir.check_target(series)  # its parent: exists, writable, safe
        if not make:
            return series
        series.mkdir(mode=0o700)
    if not series.is_dir():
        raise UsageError(f"--checkpoint-dir {series} is not a directory: give a directory")
    if series.stat().st_uid != os.geteuid():
        raise UsageError(
            f"--checkpoint-dir {series} is another user's: its checkpoints would be theirs "
            "to plant or replace; give a directory of your own (a new one is made)"
        )
    if (series / MANIFEST).exists():
        raise UsageError(
            f"--checkpoint-dir {series} is a job checkpoint itself: give the directory "
            "the series of checkpoints goes into (a new one, or one made by an earlier run)"
        )
    if not os.access(series, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write in --checkpoint-dir {series}: give one you may write")
    checkpoint_dir.check_parent(series)
    return series


def members(series: Path) -> list[tuple[int, Path]]:
    """The series' checkpoint directories by number, complete or not, oldest first:
    this user's own only (one another user made in a shared directory is never
    restored, pruned or numbered after)."""
    found: list[tuple[int, Path]] = []
    me = os.geteuid()
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for child in series.iterdir():
            match = _NAME.match(child.name)
            info = child.lstat() if match else None
            if match and info and stat.S_ISDIR(info.st_mode) and info.st_uid == me:
                found.append((int(match.group(1)), child))
    return sorted(found)


def complete(series: Path) -> list[Path]:
    """The series' complete checkpoints (their manifest written last), oldest first."""
    return [path for _seq, path in members(series) if (path / MANIFEST).is_file()]


def is_series(directory: Path) -> bool:
    """Whether ``directory`` holds a series (and is no job checkpoint itself). A path
    this user cannot look into is none: reading it as a checkpoint says why, in one
    line (checkpoint_model.read)."""
    try:
        return not (directory / MANIFEST).exists() and bool(members(directory))
    except OSError:
        return False


def newest_restorable(series: Path, say: Callable[[str], None] | None = None) -> Path:
    """The newest complete checkpoint of ``series`` that reads back whole (a damaged one
    is passed over, saying why); a UsageError when there is none."""
    from hpcvm.cluster.job import checkpoint_model

    for path in reversed(complete(series)):
        try:
            checkpoint_model.read(path)
        except UsageError as exc:
            if say is not None:
                say(f"passing over {path.name}: {exc}")
            continue
        return path
    raise UsageError(
        f"{series} holds no complete job checkpoint: the job saved none before it ended "
        "(start it anew, without --restore)"
    )


def next_member(series: Path) -> Path:
    """Where the series' next checkpoint goes: one past its highest number."""
    found = members(series)
    return series / f"{PREFIX}{found[-1][0] + 1 if found else 1:06d}"


def prune(series: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` complete checkpoints, and any incomplete one
    older than the newest complete; the removed paths."""
    done = complete(series)
    if not done:
        return []
    newest = int(_NAME.match(done[-1].name).group(1))  # type: ignore[union-attr]
    kept = set(done[-keep:])
    gone = [path for seq, path in members(series) if path not in kept and seq < newest]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone
