"""Where a sample runs: natively or in a VM, behind one small interface.

``Environment.run(argv, workdir, timeout, outputs=...) -> RunOutput`` runs one suite
argv and returns its output, the host-side wall time and the evidence gathered around
it. The same argv runs both ways (the guest sees the host's root), and in both ways it
runs with the same clean environment (``env -i PATH=...``): qemu-guest-agent hands its
commands a bare environment, so the native run gets the same, or the two would not run
the same program.

Natively the argv is a child process in its own session (a Ctrl-C in the terminal
reaches hpcvm, which kills the whole benchmark process group itself). In a VM the files
``prepare`` wrote into the host work directory are recreated at the same path in the
guest (its root is the host's, read-only, under a writable tmpfs overlay), the argv runs
under a small shell wrapper that reads /proc/interrupts and the guest clock right around
it and enforces the timeout inside the guest (coreutils ``timeout``, which kills the
benchmark's whole process group), and the files the suite names are copied back.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import itertools
import os
import platform
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field

from hpcvm import __version__
from hpcvm.bench import evidence
from hpcvm.bench.cpuset import Cpuset
from hpcvm.bench.launch import ENV
from hpcvm.bench.suites import suite_packages
from hpcvm.errors import HpcvmError, InfeasiblePlanError, RuntimeFailure, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.model import Frozen
from hpcvm.plan.model import PROFILE_NAMES, PlanRequest, ProfileName, VMPlan
from hpcvm.runtime.model import BackendName, ExecResult, Machine
from hpcvm.store.records import EnvKind, NewEnvironment

STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CLEAN_ENV = (ENV, "-i", f"PATH={STD_PATH}")
NATIVE = "native"
VM_PREFIX = "vm:"
KILL_GRACE = 10.0  # seconds between the timeout's TERM and KILL
AGENT_MARGIN = 60.0  # host-side slack over the in-guest timeout before giving up
CLOCK_READS = 3  # guest clock reads on each side of a sample (the best one counts)
MAX_ARG = 64 * 1024  # bytes of base64 per argument (Linux allows 128 KiB per string)
_SPAN_FILE = ".hpcvm-span"
_IRQ_BEFORE = ".hpcvm-irq-before"
_IRQ_AFTER = ".hpcvm-irq-after"
_SEP = "@@hpcvm@@"


class RunOutput(Frozen):
    """What one run returned, as the runner records it."""

    exit_code: int
    stdout: str
    stderr: str
    host_seconds: float  # host wall time around the run (VM: around the agent call)
    guest_seconds: float | None = None  # the guest's own measure of the same run
    timed_out: bool = False
    evidence: dict[str, Any] = Field(default_factory=dict)


class Environment(Protocol):
    """A place to run samples; see the module docstring."""

    name: str
    kind: EnvKind
    vcpus: int  # CPUs a benchmark may use (np above this is refused)
    memory_bytes: int

    def start(self) -> None:
        """Make it ready (boot a VM and pause it); nothing natively."""
        ...

    def describe(self) -> NewEnvironment:
        """Plan, accelerator, CPU model and versions, for the store (after start)."""
        ...

    def activate(self) -> None:
        """About to measure here: resume a paused VM."""
        ...

    def deactivate(self) -> None:
        """Another environment is measured now: pause, so this one takes no CPU."""
        ...

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput: ...

    def close(self) -> None:
        """Release everything (a VM goes down); safe to call twice or before start."""
        ...


# -- names --------------------------------------------------------------------------------


def valid_env_names() -> tuple[str, ...]:
    return (NATIVE, *(f"{VM_PREFIX}{p}" for p in PROFILE_NAMES))


def parse_env_name(name: str) -> ProfileName | None:
    """None for native, the profile for ``vm:<profile>``; UsageError otherwise."""
    if name == NATIVE:
        return None
    profile = name.removeprefix(VM_PREFIX)
    if name.startswith(VM_PREFIX) and profile in PROFILE_NAMES:
        return profile
    raise UsageError(f"unknown environment {name!r}: choose from {', '.join(valid_env_names())}")


# -- versions -----------------------------------------------------------------------------

_VM_PACKAGES = ("qemu-system-x86", "libvirt-daemon")


@functools.cache
def host_versions() -> dict[str, str]:
    """Software that shapes the numbers: kernel, packages, QEMU, hpcvm."""
    versions = {"hpcvm": __version__, "kernel": platform.release()}
    if shutil.which("dpkg-query"):
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package} ${Version}\n", *suite_packages(), *_VM_PACKAGES],
            capture_output=True,
            text=True,
            check=False,
        )
        for line in proc.stdout.splitlines():
            package, _, version = line.partition(" ")
            if version:
                versions[package] = version
    qemu = shutil.which("qemu-system-x86_64")
    if qemu:
        proc = subprocess.run([qemu, "--version"], capture_output=True, text=True, check=False)
        first = proc.stdout.splitlines()[0] if proc.stdout else ""
        if match := re.search(r"version (\S+)", first):
            versions["qemu"] = match.group(1)
    return versions


def _meminfo_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeFailure("cannot read MemTotal from /proc/meminfo")


def _decode(data: bytes) -> str:
    return data.decode(errors="replace")


# -- native -------------------------------------------------------------------------------


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
        self.memory_bytes = _meminfo_total()
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
            stdout=_decode(out),
            stderr=_decode(err),
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


# -- VMs ----------------------------------------------------------------------------------


def plan_vm(
    profile: ProfileName,
    *,
    vcpus: int,
    memory_bytes: int,
    guest_nodes: int | None = None,
    host: HostTopology | None = None,
) -> tuple[VMPlan, list[str]]:
    """The plan of environment ``vm:<profile>`` on this host, and warnings for the run.

    On a host too small for the hpc profile's housekeeping core plus ``vcpus`` vCPUs,
    retry with no housekeeping core and say so in a warning (the VM is then the hpc
    profile minus the isolation of QEMU's threads); if the planner refuses that too,
    its original refusal stands.
    """
    from hpcvm.host import discover
    from hpcvm.plan import plan as make_plan

    host = host if host is not None else discover()
    request = PlanRequest(
        name=f"bench-{profile}",
        profile=profile,
        vcpus=vcpus,
        memory_bytes=memory_bytes,
        guest_nodes=guest_nodes if profile in ("numa", "hpc") else None,
    )
    warnings: list[str] = []
    try:
        plan = make_plan(host, request)
    except InfeasiblePlanError as exc:
        if profile != "hpc" or exc.cause != "housekeeping":
            raise _in_bench_terms(profile, exc) from exc
        try:
            plan = make_plan(host, request.model_copy(update={"housekeeping": 0}))
        except HpcvmError as again:
            raise InfeasiblePlanError(
                f"vm:hpc with {vcpus} vCPUs does not fit this host: {exc.message} "
                f"(and housekeeping 0 is refused too: {again.message}); give vm:hpc fewer "
                "vCPUs (--vm-vcpus, --np) or use vm:numa"
            ) from exc
        warnings.append(
            f"vm:hpc: this host has too few PUs for {vcpus} vCPUs plus a housekeeping core; "
            "planned with housekeeping 0 (QEMU's own threads share the vCPUs' cores), so "
            "vm:hpc here lacks the hpc profile's thread isolation"
        )
    except HpcvmError as exc:
        raise _in_bench_terms(profile, exc) from exc
    warnings += [
        f"{VM_PREFIX}{profile}: {w}"
        for w, kind in itertools.zip_longest(
            plan.warnings, plan.warning_kinds[: len(plan.warnings)], fillvalue="plan"
        )
        if kind != "tcg"  # the run says that once, from the environments' accelerators
    ]
    return plan, warnings


def _in_bench_terms(profile: str, exc: HpcvmError) -> HpcvmError:
    """The planner's refusal, said for ``hpcvm bench`` (whose VM size comes from
    --vm-vcpus or the largest --np, and --vm-memory)."""
    return type(exc)(
        f"{VM_PREFIX}{profile}: {exc.message} (in hpcvm bench the VM's --vcpus is "
        "--vm-vcpus or the largest --np, its --memory is --vm-memory)",
        cause=exc.cause,
    )


_WRAPPER = f"""PATH={STD_PATH}; export PATH
W=$1; T=$2; shift 2
cat /proc/interrupts > "$W/{_IRQ_BEFORE}" 2>/dev/null
t0=$(date +%s.%N)
timeout -k {KILL_GRACE:g} "$T" "$@"
rc=$?
t1=$(date +%s.%N)
cat /proc/interrupts > "$W/{_IRQ_AFTER}" 2>/dev/null
echo "$t0 $t1 $rc" > "$W/{_SPAN_FILE}"
exit $rc
"""

_WRITE_FILES = f"""PATH={STD_PATH}; export PATH
W=$1; shift
mkdir -p "$W" || exit 1
while [ $# -ge 3 ]; do
  printf '%s' "$3" | base64 -d >> "$W/$1" || exit 1
  shift 3
done
"""

_EVIDENCE = f"""PATH={STD_PATH}; export PATH
W=$1
cat "$W/{_SPAN_FILE}"; echo {_SEP}; cat "$W/{_IRQ_BEFORE}"; echo {_SEP}; cat "$W/{_IRQ_AFTER}"
"""

_FACTS = f"""PATH={STD_PATH}; export PATH
uname -r
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'
cat /sys/devices/system/clocksource/clocksource0/current_clocksource
nproc
"""


class VmEnvironment:
    """A VM of one profile, booted once per run and paused while others are measured."""

    kind: EnvKind = "vm"

    def __init__(
        self,
        plan: VMPlan,
        *,
        vm_name: str,
        backend: BackendName = "qemu",
    ) -> None:
        self.plan = plan
        self.profile: ProfileName = plan.profile
        self.name = f"{VM_PREFIX}{plan.profile}"
        self.vcpus = plan.vcpus
        self.memory_bytes = plan.memory_bytes
        self.vm_name = vm_name
        self.backend_name: BackendName = backend
        self.machine: Machine | None = None
        self._facts: list[str] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        from hpcvm.runtime import lifecycle

        self.machine = lifecycle.up(
            self.plan, lifecycle.UpOptions(name=self.vm_name, backend=self.backend_name)
        )
        facts = self._exec(["/bin/sh", "-c", _FACTS], 120.0)
        self._facts = facts.stdout.splitlines()
        self.deactivate()

    def _backend(self) -> Any:
        from hpcvm.runtime.backends import get_backend

        assert self.machine is not None
        return get_backend(self.machine.backend, self.machine.connect_uri)

    def activate(self) -> None:
        if self.machine is not None:
            self._backend().resume(self.machine)

    def deactivate(self) -> None:
        if self.machine is not None:
            self._backend().pause(self.machine)

    def close(self) -> None:
        from hpcvm.runtime import lifecycle

        machine, self.machine = self.machine, None
        if machine is not None:
            lifecycle.teardown(machine)

    def describe(self) -> NewEnvironment:
        facts = self._facts + [""] * (4 - len(self._facts))
        versions = {**host_versions(), "guest_kernel": facts[0], "backend": self.backend_name}
        if self.machine is not None:
            versions["guest_image"] = self.machine.image
        if facts[2]:
            versions["guest_clocksource"] = facts[2]
        return NewEnvironment(
            name=self.name,
            kind="vm",
            profile=self.profile,
            plan=self.plan.model_dump(mode="json"),
            accel=self.plan.accel,
            cpu_model=facts[1] or (self.plan.cpu.model or "qemu64"),
            versions=versions,
            vcpus=self.vcpus,
            memory_bytes=self.memory_bytes,
        )

    # -- running --------------------------------------------------------------------------

    def _exec(self, argv: Sequence[str], timeout: float) -> ExecResult:
        from hpcvm.runtime import lifecycle

        if self.machine is None:
            raise RuntimeFailure(f"{self.name}: the VM is not running")
        return lifecycle.exec_in(self.machine, list(argv), timeout)

    def _send_files(self, workdir: Path) -> None:
        """Recreate the host work directory's files at the same path in the guest."""
        args: list[str] = []
        for path in sorted(p for p in workdir.iterdir() if p.is_file()):
            encoded = base64.b64encode(path.read_bytes()).decode()
            chunks = [encoded[i : i + MAX_ARG] for i in range(0, len(encoded), MAX_ARG)] or [""]
            for index, chunk in enumerate(chunks):
                args += [path.name, str(index), chunk]
        # rm first: the guest may hold this path from an interrupted earlier attempt
        setup = _WRITE_FILES.replace("W=$1;", 'rm -rf "$1"; W=$1;', 1)
        result = self._exec(["/bin/sh", "-c", setup, "sh", str(workdir), *args], 300.0)
        if result.exit_code != 0:
            raise RuntimeFailure(
                f"{self.name}: could not create {workdir} in the guest: {result.stderr.strip()}"
            )

    def _fetch(self, workdir: Path, name: str) -> None:
        result = self._exec(["/usr/bin/base64", "-w0", str(workdir / name)], 300.0)
        if result.exit_code == 0:
            (workdir / name).write_bytes(base64.b64decode(result.stdout))

    def _clock(self) -> evidence.ClockRead | None:
        """The best of a few reads of the guest clock (qemu-ga's guest-get-time: no
        process is spawned, so a read costs one agent round trip)."""
        from hpcvm.runtime.agent import GuestAgent

        if self.machine is None or not self.machine.boot.agent_socket:
            return None
        reads: list[evidence.ClockRead] = []
        with GuestAgent(self.machine.boot.agent_socket, timeout=30.0) as agent:
            try:
                agent.ping()  # connect and sync outside the timed reads
                for _ in range(CLOCK_READS):
                    sent = time.monotonic()
                    nanoseconds = int(agent.call("guest-get-time"))
                    received = time.monotonic()
                    reads.append(
                        evidence.ClockRead(
                            host_sent=sent, host_received=received, guest=nanoseconds / 1e9
                        )
                    )
            except (HpcvmError, TypeError, ValueError):
                pass
        return evidence.best_read(reads) if reads else None

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        from hpcvm.runtime.lifecycle import ExecTimeout

        workdir.mkdir(parents=True, exist_ok=True)
        self._send_files(workdir)
        pid = self.machine.pid if self.machine else None
        clock_before = self._clock()
        host_irq_before = evidence.read_interrupts()
        kvm_before = evidence.kvm_exits(pid)
        wrapped = ["/bin/sh", "-c", _WRAPPER, "sh", str(workdir), f"{timeout:g}", *CLEAN_ENV, *argv]
        start = time.monotonic()
        timed_out = False
        try:
            result = self._exec(wrapped, timeout + KILL_GRACE + AGENT_MARGIN)
        except ExecTimeout:
            timed_out = True
            result = ExecResult(exit_code=124, stdout="", stderr="the guest agent gave up")
        seconds = time.monotonic() - start
        host_irq_after = evidence.read_interrupts()
        kvm_after = evidence.kvm_exits(pid)
        clock_after = self._clock()
        host_rates = evidence.interrupt_rates(host_irq_before, host_irq_after, seconds)
        found: dict[str, Any] = {
            "interrupts": {"host": host_rates},
            "interrupts_total": {"host": evidence.total_rate(host_rates)},
            "kvm_exits": evidence.exit_rate(kvm_before, kvm_after, seconds),
        }
        guest_seconds, guest_rates, problem = self._guest_evidence(workdir)
        if guest_rates is not None:
            found["interrupts"]["guest"] = guest_rates
            found["interrupts_total"]["guest"] = evidence.total_rate(guest_rates)
        else:
            found["guest_evidence_error"] = problem
        if clock_before is not None and clock_after is not None:
            found["clock"] = evidence.check_clock(clock_before, clock_after).model_dump()
        else:
            found["clock"] = {"available": False, "reason": "reading the guest clock failed"}
        for name in outputs:
            with contextlib.suppress(HpcvmError):
                self._fetch(workdir, name)
        exit_code = result.exit_code if result.signal is None else 128 + result.signal
        return RunOutput(
            exit_code=exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            host_seconds=seconds,
            guest_seconds=guest_seconds,
            timed_out=timed_out or exit_code == 124,
            evidence=found,
        )

    def _guest_evidence(self, workdir: Path) -> tuple[float | None, dict[str, float] | None, str]:
        """The wrapper's span and the guest's interrupt rates over it (or why not)."""
        try:
            result = self._exec(["/bin/sh", "-c", _EVIDENCE, "sh", str(workdir)], 120.0)
            span, irq0, irq1 = result.stdout.split(_SEP + "\n")
            t0, t1, _rc = span.split()
            seconds = float(t1) - float(t0)
            rates = evidence.interrupt_rates(
                evidence.parse_interrupts(irq0), evidence.parse_interrupts(irq1), seconds
            )
        except (HpcvmError, ValueError) as exc:
            return None, None, str(exc) or type(exc).__name__
        return seconds, rates, ""
