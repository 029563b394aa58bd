"""The saved state on disk: what apply overwrote, kept until ``--revert`` succeeds.

``$HPCVM_TUNE_DIR`` (tests, a guest's tmpfs) or /var/lib/hpcvm/tune holds
``state.json`` and the lock file. Every save is a temp file, fsync and rename, and the
directory is synced, so after a crash or power loss the file is either the previous
complete version or the new one.

The state directory is the caller's choice (``--state-dir``), but the host is one: a
second apply from another directory would save the first one's tuned values as the
"originals" and a revert would then restore the wrong ones. So the host also has one
lock and one record of which directory holds its applied tuning, both in ``/run``
(``$HPCVM_TUNE_HOST_DIR`` overrides): ``/run`` lives exactly as long as the values
written to ``/proc`` and ``/sys`` do (until reboot).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from hpcvm.lock import Holder, exclusive
from hpcvm.tune.dirs import DEFAULT_DIR as DEFAULT_DIR  # re-exported
from hpcvm.tune.dirs import ENV_DIR as ENV_DIR
from hpcvm.tune.errors import TuneError
from hpcvm.tune.model import SavedState, TuneTarget

STATE_FILE = "state.json"
LOCK_FILE = "tune.lock"
ENV_HOST_DIR = "HPCVM_TUNE_HOST_DIR"
DEFAULT_HOST_DIR = Path("/run")
HOST_LOCK = "hpcvm-tune.lock"
HOST_RECORD = "hpcvm-tune.applied"  # holds the state directory of the applied tuning


def state_dir(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return explicit.absolute()
    env = os.environ.get(ENV_DIR)
    return Path(env).absolute() if env else DEFAULT_DIR


def new_state(target: TuneTarget) -> SavedState:
    now = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    return SavedState(target=target, started=now, pid=os.getpid())


def load(directory: Path) -> SavedState | None:
    """The saved state, None when nothing is applied; TuneError when the file exists but
    cannot be read (it must never be silently ignored: it holds the host's old values)."""
    path = directory / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TuneError(f"cannot read saved tuning state {path}: {exc.strerror}") from exc
    try:
        return SavedState.model_validate_json(text)
    except ValidationError:
        raise TuneError(
            f"saved tuning state {path} is damaged: restore the values listed in it by hand, "
            "then remove it"
        ) from None


def save(directory: Path, state: SavedState) -> None:
    """Write ``state`` durably (temp file, fsync, rename, fsync of the directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / STATE_FILE
    tmp = directory / (STATE_FILE + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(state.model_dump_json(indent=2))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        _sync_dir(directory)
    except OSError as exc:
        raise TuneError(f"cannot save the tuning state in {directory}: {exc.strerror}") from exc


def remove(directory: Path) -> None:
    """Nothing is applied from ``directory`` any more (reverted or rolled back)."""
    (directory / STATE_FILE).unlink(missing_ok=True)
    _sync_dir(directory)
    release_host(directory)


def _sync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def host_dir() -> Path:
    env = os.environ.get(ENV_HOST_DIR)
    return Path(env).absolute() if env else DEFAULT_HOST_DIR


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[Holder]:
    """One process changes the host's tuning at a time, whatever its state directory
    (BusyError, exit 8, otherwise)."""
    for lock in (directory / LOCK_FILE, host_dir() / HOST_LOCK):
        try:  # fail here with the reason, not inside the lock's own open
            lock.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError as exc:
            raise TuneError(
                f"cannot lock {lock}: {exc.strerror} (run as root, or give "
                f"--state-dir / ${ENV_DIR} a directory you can write)"
            ) from exc
    advice = "wait for it to finish, then run `hpcvm tune --check`"
    with (
        exclusive(host_dir() / HOST_LOCK, "the host's tuning", advice),
        exclusive(directory / LOCK_FILE, "the host's tuning", advice) as holder,
    ):
        yield holder


def applied_elsewhere(directory: Path) -> Path | None:
    """The other state directory that holds this host's applied tuning, if any (a
    record naming a directory whose state is gone, reverted by hand, is no claim)."""
    try:
        other = Path((host_dir() / HOST_RECORD).read_text().strip())
    except OSError:
        return None
    if other == directory.absolute() or not (other / STATE_FILE).exists():
        return None
    return other


def claim_host(directory: Path) -> None:
    """Record that ``directory`` holds the host's applied tuning (before any write)."""
    record = host_dir() / HOST_RECORD
    tmp = record.with_name(record.name + ".tmp")
    try:
        tmp.write_text(f"{directory.absolute()}\n")
        os.replace(tmp, record)
    except OSError as exc:
        raise TuneError(f"cannot record the applied tuning in {record}: {exc.strerror}") from exc


def release_host(directory: Path) -> None:
    """Forget the record when it names ``directory`` (its tuning is reverted)."""
    record = host_dir() / HOST_RECORD
    with contextlib.suppress(OSError):
        if Path(record.read_text().strip()) == directory.absolute():
            record.unlink()
