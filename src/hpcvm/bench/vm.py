"""VM environments: plan the VM of a profile, boot it once (left paused), and run each
argv in the guest through the agent: the files the suite needs copied in and out, and
interrupts and the guest clock read around the run (see environments.py)."""

from __future__ import annotations

import base64
import contextlib
import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcvm.bench import evidence
from hpcvm.bench.environments import CLEAN_ENV, STD_PATH, VM_PREFIX, RunOutput
from hpcvm.bench.versions import host_versions
from hpcvm.errors import HpcvmError, InfeasiblePlanError, RuntimeFailure
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import PlanRequest, ProfileName, VMPlan
from hpcvm.runtime.model import BackendName, ExecResult, Machine
from hpcvm.store.records import EnvKind, NewEnvironment

KILL_GRACE = 10.0  # seconds between the timeout's TERM and KILL
AGENT_MARGIN = 60.0  # host-side slack over the in-guest timeout before giving up
CLOCK_READS = 3  # guest clock reads on each side of a sample (the best one counts)
MAX_ARG = 64 * 1024  # bytes of base64 per argument (Linux allows 128 KiB per string)
_SPAN_FILE = ".hpcvm-span"
_IRQ_BEFORE = ".hpcvm-irq-before"
_IRQ_AFTER = ".hpcvm-irq-after"
_SEP = "@@hpcvm@@"


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
                "vCPUs (--vm-vcpus, --np) or use vm:numa",
                cause=exc.cause,
                option="vcpus",
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


# The planner's request field -> what sets it in ``hpcvm bench``, as a phrase after
# "in hpcvm bench". A field bench leaves at the profile's default has no entry.
_BENCH_OPTION: dict[str, str] = {
    "vcpus": "the VM's --vcpus is --vm-vcpus or the largest --np",
    "memory_bytes": "the VM's --memory is --vm-memory",
    "guest_nodes": "the VM's --guest-nodes is --vm-guest-nodes",
    "profile": "--profile P is --env vm:P",
}
# The request field -> the flag the planner's messages call it.
_PLAN_FLAG: dict[str, str] = {
    "page_size_bytes": "--page-size",
    "housekeeping": "--housekeeping",
    "passthrough": "--passthrough",
    "accel": "--accel",
    "smt": "--smt",
}


def _in_bench_terms(profile: str, exc: HpcvmError) -> HpcvmError:
    """The planner's refusal, said for ``hpcvm bench``: the request field it is about
    (``exc.option``, data) names the bench option that sets it, or says that bench
    plans that field with the profile's default. A refusal about no request field (the
    host itself) needs no translation."""
    message = f"{VM_PREFIX}{profile}: {exc.message}"
    if exc.option in _BENCH_OPTION:
        message += f" (in hpcvm bench {_BENCH_OPTION[exc.option]})"
    elif exc.option is not None:
        flag = _PLAN_FLAG.get(exc.option, exc.option)
        message += (
            f" (hpcvm bench has no {flag}: it plans {VM_PREFIX}{profile} with the "
            "profile's default)"
        )
    return type(exc)(message, cause=exc.cause, option=exc.option)


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
    pauses = True  # paused while other environments are measured

    def __init__(
        self,
        plan: VMPlan,
        *,
        vm_name: str,
        backend: BackendName = "qemu",
        shares: tuple[str, ...] = (),
    ) -> None:
        """``shares``: host directories the suites run from besides the working
        directory (an NPB bin directory, a --cmd program's), shared read-only."""
        self.plan = plan
        self.shares = shares
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
            self.plan,
            lifecycle.UpOptions(name=self.vm_name, backend=self.backend_name, shares=self.shares),
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
