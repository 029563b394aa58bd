"""The markers a VM's run directory gets while it migrates (tasks/migrate_node.py), and what a
node's task does when a migration's source step died midway.

``migrated``: the VM migrated away; its QEMU here ended (or is stopped) because of it.

``moving``: a migration's source step runs on this VM (its pid and start time, the
target, the phase: ``sending`` while QEMU sends, ``paused`` once QEMU finished and the
VM stands still here, ``go`` just before the target is told to run it, ``told`` once it
was). The step removes it when it ends. A step killed outright (SIGKILL: no handler
runs) leaves it, and the VM paused here. The node's task, which asks
:func:`migrated_away` twice a second while it holds its VM, then settles it
(:func:`settle_abandoned`): before ``go`` the target never ran the VM (its copy is torn
down when the source stops talking, runtime/migration/move.py), so the VM is resumed here,
or, when it cannot be, taken down; from ``go`` on the target may run it, so it stays
paused until ``cluster migrate``, which started the step and sees the target's events,
learns which: the target reported the VM ready (this copy is then marked moved, and
the task takes it down as after any move) or listens again as a spare (the VM is
resumed here), by a step of its own on this node (migrate_node.run_settle). Either way
the task says what it did in one line on its stderr, the job's log.

A module of its own so that every node task need not import the migration code to ask
(some 0.2 s of a task's start, before its VM boots).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from hpcvm import procs
from hpcvm.cluster.job.state_files import KILLED
from hpcvm.model import Frozen
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine.model import Backend, Machine
from hpcvm.runtime.migration.move import Phase as Phase  # the phases are the send's

MARKER = "migrated"  # in the old VM's run dir: its QEMU ended because the VM moved
MOVING = "moving"  # in the VM's run dir while a migration's source step runs
SETTLED = "moving.settled"  # a dead step's marker, once its node's task settled it
START_SLACK = 1.0  # seconds: process start times are read at 1/HZ, written as floats

Say = Callable[[str], None]


class Moving(Frozen):
    """What the ``moving`` marker holds."""

    pid: int
    started: float  # the step's process start time (procs.process_start_time)
    node: str
    target: str
    phase: Phase
    move: str = ""  # the move's id (migrate_node.MigrateRequest)


def marker_path(name: str) -> Path:
    return paths.run_dir(name) / MARKER


def moving_path(name: str) -> Path:
    return paths.run_dir(name) / MOVING


def migrated_away(machine: Machine) -> bool:
    """Whether ``machine``'s VM migrated away (the source step left the marker). Asked
    twice a second by the node's task while it holds the VM, so a migration whose
    source step died is settled here first (module doc)."""
    if moving_path(machine.name).exists():
        settle_abandoned(machine, _say)
    return marker_path(machine.name).exists()


def write_moving(name: str, moving: Moving) -> None:
    """The ``moving`` marker, replaced whole (a half-written one is never read)."""
    path = moving_path(name)
    partial = path.with_name(f".{MOVING}.partial")
    partial.write_text(moving.model_dump_json() + "\n")
    os.replace(partial, path)


def clear_moving(name: str) -> None:
    moving_path(name).unlink(missing_ok=True)


def read_moving(name: str, path: Path | None = None) -> Moving | None:
    """The ``moving`` marker (or the one at ``path``: a settled one), if readable."""
    try:
        return Moving.model_validate_json((path or moving_path(name)).read_text())
    except (OSError, ValueError):
        return None


def settled_path(name: str) -> Path:
    return paths.run_dir(name) / SETTLED


def step_alive(moving: Moving) -> bool:
    """Whether the source step that wrote ``moving`` still runs (its pid, with its
    start time: a reused pid is another process)."""
    started = procs.process_start_time(moving.pid)
    return (
        started is not None
        and procs.pid_alive(moving.pid, reap=True)
        and abs(started - moving.started) <= START_SLACK
    )


def settle_abandoned(machine: Machine, say: Say) -> str | None:
    """When the source step migrating ``machine`` is dead and did not finish: resume
    the VM (before ``go``) or leave it paused (after), or take it down when it cannot be
    resumed; ``say`` the one line that tells which, and return it. None while the step
    runs, or when there is nothing to settle."""
    moving = read_moving(machine.name)
    if moving is None or step_alive(moving) or marker_path(machine.name).exists():
        return None
    what = (
        f"VM {machine.name} on {moving.node}: its migration to {moving.target} {KILLED} "
        f"{moving.pid} gone)"
    )
    if moving.phase in ("go", "told"):
        line = (
            f"{what} {'after' if moving.phase == 'told' else 'as'} the target was told to "
            "run it: it stays paused here, since it may run there, until hpcvm cluster "
            "migrate learns whether it does (it then takes this copy down or resumes it)"
        )
    else:
        line = f"{what} before the target was told to run it: {resume_or_stop(machine)}"
    with contextlib.suppress(OSError):
        os.replace(moving_path(machine.name), settled_path(machine.name))
    say(line)
    return line


def resume_or_stop(machine: Machine) -> str:
    """The VM running here again, or, when QEMU will not resume it, taken down; which,
    as a phrase."""
    from hpcvm.errors import HpcvmError
    from hpcvm.runtime.backends.registry import get_backend

    backend = get_backend(machine.backend, machine.connect_uri)
    try:
        _cancel_outgoing(machine, backend)
        if backend.status(machine) == "running":
            return "it runs on here (it was not paused yet)"
        backend.resume(machine)
        return "resumed here"
    except HpcvmError as exc:
        with contextlib.suppress(HpcvmError):
            backend.stop(machine, timeout=10.0)
        return f"it could not be resumed ({exc}), so it was taken down here"


CANCEL_WAIT = 30.0  # seconds for QEMU to end an outgoing migration it was told to cancel
_ACTIVE = ("setup", "active", "pre-switchover", "device", "cancelling", "wait-unplug")


def _cancel_outgoing(machine: Machine, backend: Backend) -> None:
    """End the migration QEMU may still be sending (it holds the dead step's socket, so
    it could finish and pause the VM after the resume): cancel it and wait until QEMU
    says it is over."""
    import time

    from hpcvm.errors import HpcvmError

    with contextlib.suppress(HpcvmError):
        backend.qmp(machine, "migrate_cancel")
    deadline = time.monotonic() + CANCEL_WAIT
    while time.monotonic() < deadline:
        status = backend.qmp(machine, "query-migrate")
        if not isinstance(status, dict) or status.get("status") not in _ACTIVE:
            return
        time.sleep(0.2)


def _say(line: str) -> None:
    print(f"hpcvm: {line}", file=sys.stderr, flush=True)
