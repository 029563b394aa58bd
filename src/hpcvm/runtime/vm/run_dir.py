"""A new VM's run directory, for ``up``: the name refused while another VM holds it (a
stale one's leftovers cleaned instead), then the directory made atomically and held
locked while the VM starts.

Why a module of its own: who may take a name, and that no other process ever sees the
directory half-made, is a protocol with ``ps``, ``down`` and other ``up``s
(runtime/machine/state.py), apart from what goes into the directory. Why in vm/: only
``up`` uses it, and a stale VM is cleaned as ``ps`` cleans it (runtime/vm/inventory.py).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hpcvm.errors import UsageError
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from hpcvm.runtime.vm.inventory import clean_stale


def refuse_if_in_use(name: str) -> None:
    """Refuse a name another VM holds (running, paused or starting); a stale VM of
    that name is cleaned up instead."""
    directory = paths.run_dir(name)
    if not directory.exists():
        return
    entry = state.entry_for(directory)
    if entry.state == "stale":
        clean_stale(entry)
        return
    pid = f", pid {entry.machine.pid}" if entry.machine and entry.machine.pid else ""
    raise UsageError(
        f"a VM named {name!r} already exists ({entry.state}{pid}): choose another --name "
        f"or stop it with `hpcvm down {name}`"
    )


@contextlib.contextmanager
def claimed_run_dir(name: str) -> Iterator[Path]:
    """Create the VM's directory atomically and hold its up-lock while starting.

    The directory is built under a hidden temporary name with the lock already held and
    then renamed into place, so no other process ever sees it unlocked and half-made.
    """
    root = paths.ensure_root()
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))  # mode 0700
    final = root / name
    try:
        with state.starting_lock(tmp):
            try:
                os.rename(tmp, final)
            except OSError as exc:
                raise UsageError(
                    f"a VM named {name!r} is being created by another process: choose "
                    "another --name"
                ) from exc
            try:
                yield final
            except BaseException:
                # Failures before QEMU exists (teardown handles the later ones).
                if state.read_machine(final) is None:
                    state.remove_run_dir(final)
                raise
    finally:
        if tmp.exists():
            state.remove_run_dir(tmp)
