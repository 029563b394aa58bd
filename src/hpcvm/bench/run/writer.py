"""One writer per results directory: ``results_writer`` holds the directory's lock for a
whole bench run (a second run into it is refused at once, exit 8), and takes down the
VMs a killed writer left running before this one measures beside them.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from hpcvm import procs
from hpcvm.lock import Holder, exclusive, read_holder
from hpcvm.store import writer_lock_path

Warn = Callable[[str], None]


@contextlib.contextmanager
def results_writer(out_dir: Path, warn: Warn | None = None) -> Iterator[None]:
    """Be the one writer of ``out_dir`` for the block, or raise BusyError (exit 8) at
    once, before anything is read, booted or written. The lock dies with its holder, so
    a run whose writer was killed can be resumed at once. A directory made here and left
    holding nothing but the lock (the request was refused) is removed again."""
    out_dir = out_dir.absolute()
    made = not out_dir.exists()
    lock = writer_lock_path(out_dir)
    advice = "wait for it to finish, or stop it and then continue the run with --resume"
    previous = read_holder(lock)  # the last writer, as it wrote itself in
    with exclusive(lock, f"results directory {out_dir}", advice):
        _down_dead_writers_vms(previous, warn)
        try:
            yield
        except BaseException:
            if made and [p.name for p in out_dir.iterdir()] == [lock.name]:
                lock.unlink()
                out_dir.rmdir()
            raise


def _down_dead_writers_vms(previous: Holder | None, warn: Warn | None) -> None:
    """A bench killed with SIGKILL leaves its VMs (``bench<pid>-<profile>``) running:
    take them down before this one starts, so that they neither hold the huge pages and
    PUs the resumed run needs nor run beside its measurements. This process holds the
    lock, so that writer is gone; were its pid running again (reused), the VMs by that
    name could be another bench's, and are left alone."""
    from hpcvm.runtime.vm import (
        inventory,  # only a VM run needs them
        stopping,
    )

    if previous is None or previous.host != socket.gethostname():
        return
    if previous.pid == os.getpid() or procs.pid_alive(previous.pid, reap=True):
        return
    prefix = f"bench{previous.pid}-"
    for vm in inventory.list_vms():
        if vm.name.startswith(prefix) and vm.state != "stale":
            if warn:
                warn(f"{vm.name} was left running by pid {previous.pid}, killed; taking it down")
            stopping.down(vm.name)
