"""Where a command writes its files (``bench --out``, ``results --csv``, ``report --out``),
checked before anything starts.

A path that cannot take the files is refused in one line naming it, what is wrong and
what to do (UsageError, exit 2: the user chose the path, or the working directory the
default lies in), before a VM boots, a lock is taken or a directory is made, so a
refused command leaves nothing behind. The checks ask the kernel the question the
write would (``os.access`` with this process's ids, as the open and mkdir calls would),
so root passes where root would, except on a read-only file system.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from hpcvm.errors import UsageError

if TYPE_CHECKING:
    import click

HINT_DIR = "~/hpcvm-results"  # an example of a directory every user may make


def refuse_empty(option: str, value: str | None) -> None:
    """``--out ''`` would be the working directory itself (Path("") is "."): refused,
    so that an empty shell variable never scatters files into the current directory."""
    if value is not None and not value.strip():
        raise UsageError(f"{option} is empty: give a path, e.g. {option} {HINT_DIR}")


def path_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """Click callback for a path option or argument: an empty one is refused
    (``refuse_empty``). Give it ``type=str``: click's Path type turns "" into "."
    before a callback sees it."""
    name = param.opts[0] if param.opts else str(param.name)
    refuse_empty(name if name.startswith("-") else name.upper(), value)
    return None if value is None else Path(value)


def check_writable_dir(path: Path, option: str) -> None:
    """``path`` is a directory this process can write into, or one it can make (its
    nearest existing parent is a directory it can write into)."""
    where = path.absolute()
    state = _stat(where, option)
    if state is not None:
        if not os.path.isdir(where):
            raise UsageError(
                f"{option} {path} exists and is not a directory: give a directory, e.g. "
                f"{option} {HINT_DIR}"
            )
        _need_write(where, where, option, path)
        return
    parent = _nearest_existing(where, option)
    if not os.path.isdir(parent):
        raise UsageError(
            f"{option} {path}: {parent} is not a directory, so {where} cannot be made: "
            f"give another path, e.g. {option} {HINT_DIR}"
        )
    _need_write(parent, where, option, path)


def check_results_dir(path: Path, option: str) -> None:
    """A results directory a bench run can write: ``check_writable_dir``, and the
    results database and writer's lock already in it (a run to add to or resume), if
    any, files this process can write."""
    from hpcvm.store.db import DB_NAME, WRITER_LOCK

    check_writable_dir(path, option)
    for name in (DB_NAME, WRITER_LOCK):
        file = path.absolute() / name
        if _stat(file, option) is not None and not os.access(file, os.W_OK):
            raise UsageError(
                f"{option} {path}: {file} is {_why_not(file)}: give {option} a new "
                f"directory of your own, e.g. {option} {HINT_DIR}"
            )


def check_writable_file(path: Path, option: str) -> None:
    """``path`` names a file this process can write: not a directory, and in an
    existing directory it can write into (the file is written to a temporary name
    there and renamed into place)."""
    where = path.absolute()
    hint = f"~/{where.name}"
    if _stat(where, option, hint) is not None and os.path.isdir(where):
        raise UsageError(
            f"{option} {path} is a directory: give a file name, e.g. {option} {path}/out.csv"
        )
    parent = where.parent
    if _stat(parent, option, hint) is None or not os.path.isdir(parent):
        raise UsageError(
            f"{option} {path}: the directory {parent} does not exist: make it first or "
            f"give a file in an existing directory"
        )
    _need_write(parent, where, option, path, hint=hint)


@contextlib.contextmanager
def removed_if_refused(path: Path) -> Iterator[None]:
    """Remove again, when the block raises, the directories on the way to ``path`` that
    did not exist before it and are empty after it (the writer's lock removes ``path``
    itself; ``bench --out new/a/b`` refused must not leave ``new/a`` behind)."""
    where = path.absolute()
    missing = [p for p in (where, *where.parents) if not os.path.lexists(p)]
    try:
        yield
    except BaseException:
        for directory in missing:  # deepest first
            with contextlib.suppress(OSError):  # not empty, or gone: leave it
                directory.rmdir()
        raise


def _need_write(
    directory: Path, target: Path, option: str, given: Path, *, hint: str = HINT_DIR
) -> None:
    if os.access(directory, os.W_OK | os.X_OK):
        return
    why = _why_not(directory)
    where = "the working directory " if directory == Path.cwd() else ""
    raise UsageError(
        f"{option} {given}: cannot write {target} ({where}{directory} is {why}): give "
        f"{option} a path of your own, e.g. {option} {hint}"
    )


def _why_not(directory: Path) -> str:
    """Why this process cannot write ``directory`` (or a file), in the words a user
    acts on: "<path> is ..." reads on."""
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "on a read-only file system"
    except OSError:
        pass
    try:
        owner = directory.owner()
    except (KeyError, OSError):
        owner = "another user"
    return f"not writable by this user, owner {owner}"


def _stat(path: Path, option: str, hint: str = HINT_DIR) -> os.stat_result | None:
    """``stat(path)``, None when it does not exist; a directory on the way this user
    may not enter is said in one line (Path.exists raises PermissionError there)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None  # a file on the way: the caller names it
    except PermissionError as exc:
        raise UsageError(
            f"{option} {path}: this user may not enter {_blocking(path)} ({exc.strerror}): "
            f"give {option} a path of your own, e.g. {option} {hint}"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise UsageError(
                f"{option} {path}: the name is too long: give a shorter path"
            ) from None
        raise


def _blocking(path: Path) -> Path:
    """The first directory on the way to ``path`` this process may not search."""
    for parent in reversed(path.parents):
        if not os.access(parent, os.X_OK):
            return parent
    return path.parent


def _nearest_existing(path: Path, option: str) -> Path:
    """The nearest ancestor of ``path`` that exists (``/`` at the latest)."""
    for parent in path.parents:
        if _stat(parent, option) is not None:
            return parent
    return Path(path.anchor)


def slug(text: str) -> str:
    """A file-name-safe form of an environment or suite name (``vm:hpc`` -> ``vm-hpc``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"
