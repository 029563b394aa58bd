"""The native environment: this host, confined to the tuned VM's PUs and memory nodes,
running each argv as a child in its own session with the same clean environment a guest
gets (see environments.py).

Two ways to confine, chosen by what the kernel lets this process do (placement.py's
``Confinement``): a cgroup cpuset (cpuset.py), which every process in it obeys, hwloc and
so mpirun included; or, for a user who may not make one, what any process may do: the
run starts under ``numactl --physcpubind --membind`` (CPU affinity and a bound memory
policy, inherited by everything it starts), and an mpirun in it gets the same PUs with
``--cpu-list``, since mpirun binds its ranks from hwloc's view of the whole node and would
otherwise leave the affinity it was started with, and each rank's memory bound to its
PUs' node (mpirun would reset the policy). Inside a Slurm job the job's cgroup bounds
both ways as well."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from hpcvm.bench.core.launch import find_program, mpirun_program, with_cpu_set
from hpcvm.bench.envs import evidence
from hpcvm.bench.envs.cpuset import Cpuset
from hpcvm.bench.envs.environments import CLEAN_ENV, NATIVE, RunOutput, decode_output
from hpcvm.bench.envs.mpiwatch import LAUNCHERS, RankWatch, kill_session, rank_lines
from hpcvm.bench.envs.placement import Confinement
from hpcvm.bench.envs.versions import host_versions
from hpcvm.errors import RuntimeFailure
from hpcvm.host.model import HostTopology
from hpcvm.store.records import EnvKind, NewEnvironment
from hpcvm.units import format_cpu_list

# mpirun resets its ranks' memory policy to the default (measured: ``numactl --show`` in
# a rank under ``numactl --membind=0`` says "policy: default"); this binds each rank's
# memory to the node of the PUs it is bound to instead, as the cpuset's mems would.
MPI_LOCAL_MEMORY = ["--mca", "hwloc_base_mem_alloc_policy", "local_only"]


class NativeEnvironment:
    """This host, as it is (the baseline every VM is compared with)."""

    kind: EnvKind = "native"

    def __init__(
        self,
        host: HostTopology | None = None,
        *,
        cpus: Sequence[int] | None = None,
        mems: Sequence[int] = (),
        confine: Confinement = "cpuset",
    ) -> None:
        """``cpus``/``mems``: the PUs and memory nodes every run is confined to, by
        ``confine`` (module doc); None: wherever this process may run."""
        self.name = NATIVE
        self.cpus = tuple(cpus) if cpus is not None else None
        self.mems = tuple(mems)
        self.confine = confine
        self.vcpus = len(self.cpus) if self.cpus is not None else len(os.sched_getaffinity(0))
        self.memory_bytes = meminfo_total()
        self._cpu_model = host.cpu_model if host is not None else platform.processor()
        self._cpuset: Cpuset | None = None

    def start(self) -> None:
        if self.cpus is not None and self.confine == "cpuset" and self._cpuset is None:
            self._cpuset = Cpuset.create(self.cpus, self.mems)

    def describe(self) -> NewEnvironment:
        return NewEnvironment(
            name=self.name,
            kind=self.kind,
            accel="native",
            cpu_model=self._cpu_model,
            versions=host_versions(),
            vcpus=self.vcpus,
            memory_bytes=self.memory_bytes,
        )

    def activate(self) -> None:
        return None

    def deactivate(self) -> None:
        return None

    def close(self) -> None:
        if self._cpuset is not None:
            self._cpuset.remove()
            self._cpuset = None

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        workdir.mkdir(parents=True, exist_ok=True)
        irq_before = evidence.read_interrupts()
        start = time.monotonic()
        proc = subprocess.Popen(
            [*CLEAN_ENV, *self.confined(argv)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            start_new_session=True,
            preexec_fn=None if self._cpuset is None else self._cpuset.enter(),
        )
        timed_out = False
        hung: str | None = None
        try:
            out, err, hung = _communicate(proc, start + timeout, watch=launches_mpi(argv))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        except BaseException:
            _kill_group(proc)
            proc.communicate()
            raise
        seconds = time.monotonic() - start
        if hung is not None:
            err = _with_hang(err, hung)
        irq_after = evidence.read_interrupts()
        rates = evidence.interrupt_rates(irq_before, irq_after, seconds)
        return RunOutput(
            exit_code=proc.returncode if not timed_out else 124,
            stdout=decode_output(out),
            stderr=decode_output(err),
            host_seconds=seconds,
            timed_out=timed_out,
            evidence={
                "interrupts": {"host": rates},
                "interrupts_total": {"host": evidence.total_rate(rates)},
            },
        )

    def confined(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as it runs: unchanged in a cpuset (or unconfined); else under
        numactl's affinity and memory binding, its mpirun's ranks bound to the PUs."""
        if self.cpus is None or self.confine == "cpuset":
            return list(argv)
        return [*affinity_prefix(self.cpus, self.mems), *mpi_held(argv, self.cpus)]


def affinity_prefix(cpus: Sequence[int], mems: Sequence[int]) -> list[str]:
    """``numactl`` holding what it starts (and all that starts) to ``cpus`` and, when
    given, memory on ``mems``: what any user may do (module doc)."""
    bind = [find_program("numactl", "numactl"), f"--physcpubind={format_cpu_list(list(cpus))}"]
    if mems:
        bind.append(f"--membind={format_cpu_list(list(mems))}")
    return [*bind, "--"]


def mpi_held(argv: Sequence[str], cpus: Sequence[int]) -> list[str]:
    """``argv`` with its mpirun's ranks bound to ``cpus`` and their memory to those PUs'
    node (mpirun binds from hwloc's whole node and resets the memory policy)."""
    out = list(argv)
    program = mpirun_program() if any("mpirun" in Path(w).name for w in out) else ""
    if program in out:
        out = with_cpu_set(out, program, cpus)
        at = out.index(program) + 1
        out[at:at] = MPI_LOCAL_MEMORY
    return out


WATCH_POLL = 0.5  # seconds between looks at mpirun's ranks (bench/envs/mpiwatch.py)


def launches_mpi(argv: Sequence[str]) -> bool:
    """Whether ``argv`` starts Open MPI's launcher: only such a run can hang the way
    bench/envs/mpiwatch.py watches for, and only it pays for the watch (a look through /proc
    twice a second, which a single-process run's measurement is spared)."""
    return any(Path(arg).name.startswith(LAUNCHERS) for arg in argv)


def _communicate(
    proc: subprocess.Popen[bytes], deadline: float, *, watch: bool
) -> tuple[bytes, bytes, str | None]:
    """The run's output once it ends, with None; or, when ``watch`` and its mpirun hangs
    after a rank ended (bench/envs/mpiwatch.py), the run killed at once and why.
    TimeoutExpired past ``deadline`` (time.monotonic)."""
    if not watch:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        return out, err, None
    ranks = RankWatch(session=proc.pid)
    while True:
        left = deadline - time.monotonic()
        try:
            out, err = proc.communicate(timeout=max(0.0, min(WATCH_POLL, left)))
            return out, err, None
        except subprocess.TimeoutExpired:
            if left <= WATCH_POLL:
                raise
        if (why := ranks.stuck()) is not None:
            _kill_group(proc)
            out, err = proc.communicate()
            return out, err, why


def _with_hang(err: bytes, why: str) -> bytes:
    """stderr with a last line saying why hpcvm killed the run and the ranks' own last
    error lines (a failure record shows the last lines)."""
    said = rank_lines(decode_output(err))
    line = f"hpcvm: {why}" + (f"; the ranks said: {said}" if said else "")
    return err + (b"" if not err or err.endswith(b"\n") else b"\n") + line.encode() + b"\n"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the benchmark and everything it started: its session (mpirun's ranks run
    in process groups of their own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    kill_session(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30.0)


def meminfo_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeFailure("cannot read MemTotal from /proc/meminfo")
