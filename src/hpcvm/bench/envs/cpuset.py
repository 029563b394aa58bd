"""Confine native benchmark runs to the VM's PUs and memory nodes with a kernel cpuset.

A fair baseline runs where the tuned VM runs: on the PUs its vCPUs are pinned to and
the memory nodes its RAM is bound to. ``numactl`` or ``taskset`` are not enough for MPI:
Open MPI's mpirun reads the machine with hwloc and binds its ranks itself, ignoring the
affinity it was started with (measured here: under ``taskset -c 1`` rank 0 is bound to
core 0). hwloc does honour a cgroup cpuset, as it must under Slurm's task/cgroup: in a
cpuset of PU 1, mpirun binds rank 0 to PU 1 and refuses a second rank. So a native
environment with a CPU list gets its own cpuset (cgroup v2 where mounted, else the v1
cpuset hierarchy), every run is started inside it, and it is removed when the
environment closes. A cpuset left by a bench killed with SIGKILL is empty and is removed
by the next native environment that starts.

Only root (or a cgroup delegated to the user) may make one. A user's bench confines its
runs with what any process may do instead (native.py: CPU affinity and a bound memory
policy, and mpirun told the same PUs with ``--cpu-list``): :func:`probe` says which of
the two this process gets, by making and removing a real cpuset, so the choice is the
kernel's answer, not a guess from the uid.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcvm.errors import BenchmarkError
from hpcvm.units import format_cpu_list

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "hpcvm-native-"
_SERIAL = itertools.count()
# The ``cause`` of a BenchmarkError when this process may not make a cpuset at all (not
# permitted, read-only cgroup file system, no cpuset hierarchy): affinity can do instead.
DENIED = "cpuset-denied"
_DENIED_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}


def _hierarchy(root: Path) -> tuple[Path, str]:
    """Where cpusets are made and the file a process is moved in with."""
    if (root / "cgroup.controllers").exists():
        return root, "cgroup.procs"
    if (root / "cpuset" / "cpuset.cpus").exists():
        return root / "cpuset", "tasks"
    raise BenchmarkError(
        f"no cpuset cgroup under {root}: native runs cannot be confined to the VM's PUs; "
        "mount cgroup2 (or the v1 cpuset controller), or pass --native-cpus all",
        cause=DENIED,
    )


def _enable_v2_cpuset(base: Path) -> None:
    """cgroup v2 hands the cpuset controller to children only when asked to."""
    control = base / "cgroup.subtree_control"
    if control.exists() and "cpuset" not in control.read_text().split():
        control.write_text("+cpuset")


def _remove_stale(base: Path) -> None:
    """Remove empty cpusets of benches that died (their pid is in the name)."""
    for path in base.glob(f"{PREFIX}*"):
        pid = path.name.removeprefix(PREFIX).split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                path.rmdir()


@dataclass
class Cpuset:
    """One cpuset made for one native environment of this process."""

    path: Path
    procs_file: str
    cpus: tuple[int, ...]
    mems: tuple[int, ...]

    @classmethod
    def create(
        cls, cpus: Sequence[int], mems: Sequence[int], *, root: Path = CGROUP_ROOT
    ) -> Cpuset:
        base, procs_file = _hierarchy(root)
        path = base / f"{PREFIX}{os.getpid()}-{next(_SERIAL)}"
        try:
            if procs_file == "cgroup.procs":
                _enable_v2_cpuset(base)
            _remove_stale(base)
            path.mkdir(exist_ok=True)
            (path / "cpuset.mems").write_text(format_cpu_list(list(mems)))
            (path / "cpuset.cpus").write_text(format_cpu_list(list(cpus)))
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()  # made, then refused its PUs or nodes: nothing left behind
            raise BenchmarkError(
                f"cannot make a cpuset of PUs {format_cpu_list(list(cpus))} and nodes "
                f"{format_cpu_list(list(mems))} under {base}: {exc.strerror}; "
                "choose PUs and nodes this process may use (--native-cpus)",
                cause=DENIED if exc.errno in _DENIED_ERRNOS else None,
            ) from exc
        return cls(path=path, procs_file=procs_file, cpus=tuple(cpus), mems=tuple(mems))

    def enter(self) -> Callable[[], None]:
        """A ``preexec_fn`` that moves the child into the cpuset before it executes."""
        target = str(self.path / self.procs_file)

        def _move() -> None:
            with open(target, "w") as f:
                f.write(str(os.getpid()))

        return _move

    def remove(self) -> None:
        """Remove the cpuset once its last process is gone. A killed benchmark's
        processes may take a moment to leave it (rmdir says EBUSY until then); one that
        stays busy is left, empty later, for the next bench's stale sweep: tearing down
        never fails on it."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def probe(cpus: Sequence[int], mems: Sequence[int], *, root: Path = CGROUP_ROOT) -> bool:
    """Whether this process may confine runs with a cpuset of ``cpus`` and ``mems``: one
    is made and removed. False only when cpusets are denied to it; any other failure
    (PUs or nodes the kernel refuses) is raised, as making the real one would."""
    try:
        made = Cpuset.create(cpus, mems, root=root)
    except BenchmarkError as exc:
        if exc.cause == DENIED:
            return False
        raise
    made.remove()
    return True
