"""Samples in a running guest: one guest process tree per sample, through the guest
agent, with the evidence around it (bench/envs/vm.py and
cluster/benchnodes/environments.py own the VMs; this owns what runs in them).

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
  per-sample token to the VM's completion port (runtime/channels/completion.py), which the host
  waits on asleep; while the benchmark runs the agent is asked about it once a second,
  not every 10 to 250 ms, so nothing wakes the guest's agent during the measurement.
The shell and the port's device are found once per boot, with the guest's facts.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcvm.bench.envs import evidence
from hpcvm.bench.envs.environments import CLEAN_ENV, STD_PATH, RunOutput
from hpcvm.errors import HpcvmError, RuntimeFailure
from hpcvm.runtime.machine.model import ExecResult, Machine

if TYPE_CHECKING:
    from hpcvm.runtime.channels.agent import GuestAgent
    from hpcvm.runtime.channels.completion import CompletionPort

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

FACTS_SCRIPT = f"""PATH={STD_PATH}; export PATH
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
_SHELL_FACT = 4  # the line of FACTS_SCRIPT that names bash (empty: the guest has none)
_BUSYBOX_FACT = 5  # busybox, when it runs its sh
_PORT_FACT = 6  # the completion port's device (empty: the VM has none)


class GuestSampler:
    """Runs samples in one running VM's guest (module doc). ``alive`` says whether the
    VM still runs (its backend's answer by default); ``facts`` are the guest's, read by
    ``learn`` once after boot."""

    def __init__(
        self,
        machine: Machine,
        name: str,
        *,
        alive: Callable[[Machine], bool] | None = None,
        facts: Sequence[str] = (),
    ) -> None:
        self.machine = machine
        self.name = name  # the environment's, for messages
        self._alive = alive
        self._facts = list(facts)
        self._agent_conn: GuestAgent | None = None  # one connection for the VM's life
        self._done: CompletionPort | None = None

    @property
    def facts(self) -> tuple[str, ...]:
        """The guest's kernel, CPU model, clocksource, CPUs, bash, busybox and the
        completion port's device, one per line of FACTS_SCRIPT."""
        return tuple(self._facts)

    def learn(self) -> None:
        """Read the guest's facts (one guest exec)."""
        port = self.machine.boot.done_port_name
        with self._agent() as agent:
            facts = self._exec_on(agent, ["/bin/sh", "-c", FACTS_SCRIPT, "sh", port], 120.0)
        self._facts = facts.stdout.splitlines()

    def exec(self, argv: list[str], timeout: float | None = None) -> ExecResult:
        """One command in the guest on the kept agent connection: what the checks
        after boot run (runtime/verify/checks.py ``GuestExec``)."""
        with self._agent() as agent:
            return self._exec_on(agent, argv, timeout if timeout is not None else 120.0)

    def close(self) -> None:
        """Drop the agent connection and the completion port (the VM is not ours)."""
        agent, self._agent_conn = self._agent_conn, None
        if agent is not None:
            agent.close()
        done, self._done = self._done, None
        if done is not None:
            done.close()

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
        from hpcvm.runtime.channels.agent import GuestAgent

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
            self.close()
            raise

    def _completion(self) -> CompletionPort | None:
        """The host end of the completion port, connected (None: the guest cannot
        signal, and the agent is polled as for any command)."""
        from hpcvm.runtime.channels.completion import CompletionPort

        boot = self.machine.boot
        if not boot.done_socket or not self._fact(_PORT_FACT):
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
        from hpcvm.runtime.vm.guest_exec import exec_on

        return exec_on(self.machine, agent, argv, timeout, finished=finished, alive=self._alive)

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
        from hpcvm.runtime.channels.agent import AgentCommandError

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
        from hpcvm.runtime.vm.guest_exec import ExecTimeout

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
        pid = self.machine.pid
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
