"""The native environment: this host, confined to the tuned VM's PUs and memory nodes
(cpuset.py), running each argv as a child in its own session with the same clean
environment a guest gets (see environments.py)."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from hpcvm.bench import evidence
from hpcvm.bench.cpuset import Cpuset
from hpcvm.bench.environments import CLEAN_ENV, NATIVE, RunOutput, decode_output
from hpcvm.bench.versions import host_versions
from hpcvm.errors import RuntimeFailure
from hpcvm.host.model import HostTopology
from hpcvm.store.records import EnvKind, NewEnvironment


class NativeEnvironment:
    """This host, as it is (the baseline every VM is compared with)."""

    kind: EnvKind = "native"

    def __init__(
        self,
        host: HostTopology | None = None,
        *,
        cpus: Sequence[int] | None = None,
        mems: Sequence[int] = (),
    ) -> None:
        """``cpus``/``mems``: the PUs and memory nodes every run is confined to (a
        cpuset, see cpuset.py); None: wherever this process may run."""
        self.name = NATIVE
        self.cpus = tuple(cpus) if cpus is not None else None
        self.mems = tuple(mems)
        self.vcpus = len(self.cpus) if self.cpus is not None else len(os.sched_getaffinity(0))
        self.memory_bytes = meminfo_total()
        self._cpu_model = host.cpu_model if host is not None else platform.processor()
        self._cpuset: Cpuset | None = None

    def start(self) -> None:
        if self.cpus is not None and self._cpuset is None:
            self._cpuset = Cpuset.create(self.cpus, self.mems)

    def describe(self) -> NewEnvironment:
        return NewEnvironment(
            name=self.name,
            kind="native",
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
            [*CLEAN_ENV, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            start_new_session=True,
            preexec_fn=None if self._cpuset is None else self._cpuset.enter(),
        )
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        except BaseException:
            _kill_group(proc)
            proc.communicate()
            raise
        seconds = time.monotonic() - start
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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the benchmark and everything it started (mpirun's ranks)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30.0)


def meminfo_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeFailure("cannot read MemTotal from /proc/meminfo")
