"""VM environments: plan the VM of a profile, boot it once (left paused), and run each
argv in the guest through the agent (see environments.py).

One sample is one guest process tree: a small shell script recreates the work
directory with the suite's input files (passed as arguments), reads /proc/interrupts
and the guest clock right around the benchmark, enforces the timeout inside the guest
and writes that evidence to a file. The evidence and the suite's output files then come
back through the agent's file commands, and the guest clock is read through the agent
before and after: agent round trips cost well under a millisecond, while every guest
process costs some 70 ms under TCG. So a sample costs about one process more than its
benchmark, not the fifteen processes in four execs it once took (1.2 s per sample under
TCG).

What is left is kept small (issue 29; docs/performance.md has the figures):
- one agent connection for the VM's life, not one per sample (a new connection takes
  some 100 ms to sync under TCG);
- the script runs under busybox's sh where the guest has busybox (the static binary
  the built-in guest is made of, shared from the host): it starts in a fraction of
  bash's time, and its ``mkdir``/``rm``/``base64`` are applets it forks without an
  exec; else bash (its ``$EPOCHREALTIME`` and ``read`` builtins spare a process per
  clock and interrupt read), else /bin/sh with ``date``/``cat``;
- the end of the sample is signalled, not polled for: the script's EXIT trap writes a
  per-sample token to the VM's completion port (runtime/completion.py), which the host
  waits on asleep; while the benchmark runs the agent is asked about it once a second,
  not every 10 to 250 ms, so nothing wakes the guest's agent during the measurement.
The shell and the port's device are found once per boot, with the guest's facts.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcvm.bench import evidence
from hpcvm.bench.environments import CLEAN_ENV, STD_PATH, VM_PREFIX, RunOutput
from hpcvm.bench.versions import host_versions
from hpcvm.errors import HpcvmError, InfeasiblePlanError, RuntimeFailure
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import PlanRequest, ProfileName, VMPlan
from hpcvm.runtime.model import BackendName, ExecResult, Machine
from hpcvm.store.records import EnvKind, NewEnvironment

if TYPE_CHECKING:
    from hpcvm.runtime.agent import GuestAgent
    from hpcvm.runtime.completion import CompletionPort

KILL_GRACE = 10.0  # seconds between the timeout's TERM and KILL
AGENT_MARGIN = 60.0  # host-side slack over the in-guest timeout before giving up
CLOCK_READS = 3  # guest clock reads on each side of a sample (the best one counts)
MAX_ARG = 64 * 1024  # bytes of base64 per argument (Linux allows 128 KiB per string)
TEXT_CHUNK = MAX_ARG // 4  # characters of text per argument (at most 4 bytes each)
_EVIDENCE_FILE = ".hpcvm-evidence"
_SEP = "@@hpcvm@@"
_SETUP_FAILED = "@@hpcvm-setup-failed@@"
_SETUP_EXIT = 125
TIMEOUT = "/usr/bin/timeout"  # coreutils' (exit 124): busybox's sh would run its own applet


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


# $1 work directory, $2 timeout, $3 the completion port's device (or empty), $4 this
# sample's token, $5 number of file chunks, then (name, t|b, chunk) per chunk (text as
# is, or base64), then the argv. Evidence goes to a file, never to the benchmark's
# stdout or stderr. Written for busybox's sh, bash and a POSIX sh (module doc).
_SAMPLE = f"""PATH={STD_PATH}; export PATH; LC_ALL=C; export LC_ALL
W=$1; T=$2; D=$3; K=$4; N=$5; shift 5
if [ -n "$D" ]; then trap 'printf "%s\\n" "$K" > "$D"' EXIT; fi
fail() {{ echo "{_SETUP_FAILED} $*" >&2; exit {_SETUP_EXIT}; }}
if [ -e "$W" ]; then rm -rf "$W" || fail "cannot remove an earlier $W"; fi
mkdir -p "$W" || fail "cannot create $W"
while [ "$N" -gt 0 ]; do
  if [ "$2" = t ]; then printf '%s' "$3" >> "$W/$1"
  else printf '%s' "$3" | base64 -d >> "$W/$1"; fi || fail "cannot write $W/$1"
  N=$((N - 1)); shift 3
done
if [ -n "${{EPOCHREALTIME:-}}" ]; then
  now() {{ NOW=$EPOCHREALTIME; }}
  irq() {{ IRQ=; IFS= read -r -d '' IRQ < /proc/interrupts; }}
else
  now() {{ NOW=$(date +%s.%N); }}
  irq() {{ IRQ=$(cat /proc/interrupts 2>/dev/null); }}
fi
irq; I0=$IRQ; now; t0=$NOW
{TIMEOUT} -k {KILL_GRACE:g} "$T" "$@"
rc=$?
now; t1=$NOW; irq
printf '%s %s %s\\n{_SEP}\\n%s\\n{_SEP}\\n%s\\n' "$t0" "$t1" "$rc" "$I0" "$IRQ" \\
  > "$W/{_EVIDENCE_FILE}"
exit $rc
"""

_FACTS = f"""PATH={STD_PATH}; export PATH
uname -r
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'
cat /sys/devices/system/clocksource/clocksource0/current_clocksource
nproc
command -v bash || echo
b=$(command -v busybox) && "$b" sh -c : 2>/dev/null && echo "$b" || echo
for p in /sys/class/virtio-ports/*; do
  [ "$(cat "$p/name" 2>/dev/null)" = "$1" ] && [ -c "/dev/${{p##*/}}" ] && d="/dev/${{p##*/}}"
done
echo "${{d:-}}"
"""
_SHELL_FACT = 4  # the line of _FACTS that names bash (empty: the guest has none)
_BUSYBOX_FACT = 5  # busybox, when it runs its sh
_PORT_FACT = 6  # the completion port's device (empty: the VM has none)


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
        self._agent_conn: GuestAgent | None = None  # one connection for the VM's life
        self._done: CompletionPort | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        from hpcvm.runtime import lifecycle

        self.machine = lifecycle.up(
            self.plan,
            lifecycle.UpOptions(name=self.vm_name, backend=self.backend_name, shares=self.shares),
        )
        port = self.machine.boot.done_port_name
        facts = self._exec(["/bin/sh", "-c", _FACTS, "sh", port], 120.0)
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

        self._disconnect()
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

    def _fact(self, line: int) -> str:
        return self._facts[line] if len(self._facts) > line else ""

    def _shell(self) -> list[str]:
        """busybox's sh, else bash, else /bin/sh (module doc); from the facts read once
        after boot."""
        if self._fact(_BUSYBOX_FACT).startswith("/"):
            return [self._fact(_BUSYBOX_FACT), "sh"]
        bash = self._fact(_SHELL_FACT)
        return [bash if bash.startswith("/") else "/bin/sh"]

    @contextlib.contextmanager
    def _agent(self) -> Iterator[GuestAgent]:
        """The connection to the guest agent, kept from sample to sample: a new
        connection takes some 100 ms to sync under TCG, a request on an open one about
        1 ms. A sample that fails drops it, so the next one starts from a fresh sync."""
        from hpcvm.runtime.agent import GuestAgent

        if self.machine is None:
            raise RuntimeFailure(f"{self.name}: the VM is not running")
        boot = self.machine.boot
        if not boot.agent_socket:
            raise RuntimeFailure(f"{self.name}: the VM has no guest agent socket")
        if self._agent_conn is None:
            self._agent_conn = GuestAgent(
                boot.agent_socket, timeout=30.0, console_log=boot.serial_log
            )
        try:
            yield self._agent_conn
        except BaseException:
            self._disconnect()
            raise

    def _disconnect(self) -> None:
        agent, self._agent_conn = self._agent_conn, None
        if agent is not None:
            agent.close()
        done, self._done = self._done, None
        if done is not None:
            done.close()

    def _completion(self) -> CompletionPort | None:
        """The host end of the completion port, connected (None: the guest cannot
        signal, and the agent is polled as for any command)."""
        from hpcvm.runtime.completion import CompletionPort

        boot = self.machine.boot if self.machine else None
        if boot is None or not boot.done_socket or not self._fact(_PORT_FACT):
            return None
        if self._done is None:
            self._done = CompletionPort(boot.done_socket)
        return self._done if self._done.connect() else None

    def _exec_on(
        self,
        agent: GuestAgent,
        argv: Sequence[str],
        timeout: float,
        finished: Callable[[float], bool] | None = None,
    ) -> ExecResult:
        """``lifecycle.exec_in`` on an open connection, with its errors: ExecTimeout
        after ``timeout``, a RuntimeFailure naming the console log when the VM died."""
        from hpcvm.runtime.lifecycle import ExecTimeout

        assert self.machine is not None
        machine, backend = self.machine, self._backend()
        if not backend.alive(machine):
            raise RuntimeFailure(
                f"VM {machine.name} is not running (QEMU pid {machine.pid} gone)", cause="qemu"
            )
        try:
            return agent.exec(list(argv), timeout=timeout, finished=finished)
        except HpcvmError as exc:
            if not backend.alive(machine):
                raise RuntimeFailure(
                    f"VM {machine.name} died while running {argv[0]!r}; see its console log "
                    f"{machine.boot.serial_log}"
                ) from exc
            if exc.cause == "timeout":
                raise ExecTimeout(
                    f"{argv[0]!r} did not finish within {timeout:g} s in VM {machine.name}"
                ) from exc
            raise

    def _clock(self, agent: GuestAgent) -> evidence.ClockRead | None:
        """The best of a few reads of the guest clock (qemu-ga's guest-get-time: no
        process is spawned, so a read costs one agent round trip)."""
        reads: list[evidence.ClockRead] = []
        try:
            agent.ping()  # connected and synced outside the timed reads
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

    def _read_back(self, agent: GuestAgent, path: Path) -> bytes | None:
        """A guest file's bytes through the agent's file commands (no guest process);
        when the agent refuses them (no such file, or a guest whose qemu-ga disables
        guest-file-*), through ``base64`` in the guest; None when it cannot be read."""
        from hpcvm.runtime.agent import AgentCommandError

        try:
            return agent.read_file(str(path))
        except AgentCommandError:
            pass
        except HpcvmError:
            return None
        try:
            result = agent.exec(["/usr/bin/base64", "-w0", str(path)], 300.0)
        except HpcvmError:
            return None
        return base64.b64decode(result.stdout) if result.exit_code == 0 else None

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        """One sample in one agent connection and one guest exec (module doc)."""
        from hpcvm.runtime.lifecycle import ExecTimeout

        workdir.mkdir(parents=True, exist_ok=True)
        files = file_arguments(workdir)
        done = self._completion()
        token = secrets.token_hex(8)
        wrapped = [
            *self._shell(), "-c", _SAMPLE, "sh", str(workdir), f"{timeout:g}",
            self._fact(_PORT_FACT) if done else "", token, str(len(files) // 3), *files,
            *CLEAN_ENV, *argv,
        ]  # fmt: skip
        finished = (lambda seconds: done.wait(token, seconds)) if done else None
        pid = self.machine.pid if self.machine else None
        with self._agent() as agent:
            clock_before = self._clock(agent)
            host_irq_before, kvm_before = evidence.read_interrupts(), evidence.kvm_exits(pid)
            start = time.monotonic()
            try:
                limit = timeout + KILL_GRACE + AGENT_MARGIN
                result = self._exec_on(agent, wrapped, limit, finished)
            except ExecTimeout:
                result = ExecResult(exit_code=124, stdout="", stderr="the guest agent gave up")
            seconds = time.monotonic() - start
            host_irq_after, kvm_after = evidence.read_interrupts(), evidence.kvm_exits(pid)
            _check_setup(self.name, workdir, result)
            clock_after = self._clock(agent)
            span = self._read_back(agent, workdir / _EVIDENCE_FILE)
            for name in outputs:
                if (data := self._read_back(agent, workdir / name)) is not None:
                    (workdir / name).write_bytes(data)
        host_rates = evidence.interrupt_rates(host_irq_before, host_irq_after, seconds)
        found: dict[str, Any] = {
            "interrupts": {"host": host_rates},
            "interrupts_total": {"host": evidence.total_rate(host_rates)},
            "kvm_exits": evidence.exit_rate(kvm_before, kvm_after, seconds),
        }
        guest_seconds, guest_rates, problem = guest_evidence(span)
        if guest_rates is not None:
            found["interrupts"]["guest"] = guest_rates
            found["interrupts_total"]["guest"] = evidence.total_rate(guest_rates)
        else:
            found["guest_evidence_error"] = problem
        if clock_before is not None and clock_after is not None:
            found["clock"] = evidence.check_clock(clock_before, clock_after).model_dump()
        else:
            found["clock"] = {"available": False, "reason": "reading the guest clock failed"}
        exit_code = result.exit_code if result.signal is None else 128 + result.signal
        return RunOutput(
            exit_code=exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            host_seconds=seconds,
            guest_seconds=guest_seconds,
            timed_out=exit_code == 124,
            evidence=found,
        )


def _check_setup(name: str, workdir: Path, result: ExecResult) -> None:
    """The sample script could not recreate the work directory: the benchmark never
    ran, and the sample fails saying why."""
    if result.exit_code == _SETUP_EXIT and _SETUP_FAILED in result.stderr:
        problem = result.stderr.replace(_SETUP_FAILED, "").strip().replace("\n", "; ")
        raise RuntimeFailure(f"{name}: could not create {workdir} in the guest: {problem}")


def file_arguments(workdir: Path) -> list[str]:
    """The sample script's (name, t|b, chunk) arguments that recreate the host work
    directory's files in the guest: text as it is (``printf``, a shell builtin), other
    bytes (not UTF-8, or holding a NUL, which no argument can carry) in base64 (one
    ``base64`` process per chunk). Chunks stay under Linux's 128 KiB per argument."""
    args: list[str] = []
    for path in sorted(p for p in workdir.iterdir() if p.is_file()):
        data = path.read_bytes()
        try:
            text = data.decode()
        except UnicodeDecodeError:
            text = None
        if text is not None and "\0" not in text:
            chunks = [text[i : i + TEXT_CHUNK] for i in range(0, len(text), TEXT_CHUNK)]
            args += [a for chunk in chunks for a in (path.name, "t", chunk)]
            if not chunks:
                args += [path.name, "t", ""]
            continue
        encoded = base64.b64encode(data).decode()
        chunks = [encoded[i : i + MAX_ARG] for i in range(0, len(encoded), MAX_ARG)]
        args += [a for chunk in chunks for a in (path.name, "b", chunk)]
    return args


def guest_evidence(data: bytes | None) -> tuple[float | None, dict[str, float] | None, str]:
    """The sample script's span and the guest's interrupt rates over it (or why not),
    from its evidence file."""
    if data is None:
        return None, None, f"the guest wrote no {_EVIDENCE_FILE} (the sample script did not finish)"
    try:
        span, irq0, irq1 = data.decode(errors="replace").split(_SEP + "\n")
        t0, t1, _rc = span.split()
        seconds = float(t1) - float(t0)
        rates = evidence.interrupt_rates(
            evidence.parse_interrupts(irq0), evidence.parse_interrupts(irq1), seconds
        )
    except (HpcvmError, ValueError) as exc:
        return None, None, str(exc) or type(exc).__name__
    return seconds, rates, ""
