"""Ending an mpirun that hangs because a rank ended early.

Open MPI 4.1's ``mpirun`` (Debian 12: 4.1.4, PMIx 4.2) never ends when a rank ends
before ``MPI_Init`` completes, measured on this project's machines:

- a rank that exits (status 0) without calling ``MPI_Init``: the other ranks wait in
  ``MPI_Init``'s PMIx fence forever, mpirun with them;
- a rank refused by PMIx in ``MPI_Init`` (a rank under another uid; as a rootless
  container's rank once was, docs/comparisons.md): mpirun prints that the job was
  aborted, then hangs in PMIx's ``deregister_client`` and ignores SIGTERM.

No MCA option ends either (``orte_abort_on_non_zero_status`` is already on and covers
only the ranks that exit non-zero; ``pmix_base_exchange_timeout`` is not the fence of
``MPI_Init``), so a sample used to wait out its ``--timeout`` (3600 s by default).

The watch here sees it from outside, on the processes of the run's own session: once
one of mpirun's ranks has ended, the others either end within moments (``MPI_Finalize``
is a fence in Open MPI 4.1, so the ranks of an MPI program end together) or keep
working (a rank 0 that writes its results after ``MPI_Finalize``), or they sit idle in
``MPI_Init``. A rank waiting there polls and sleeps (measured: 6 % of one CPU), so when
:data:`GRACE` seconds after a rank ended every rank left used under :data:`IDLE_SHARE` of
a CPU, and mpirun still runs, the run is stuck: its caller kills it and records why,
with the ranks' own error lines. A rank that works on after the others ended keeps the
run going; ranks that all ended while mpirun hangs end it after ``GRACE``. What it
cannot tell from a hang: ranks of a program that is not MPI, one of which ended while
the others sleep (not compute) for longer than ``GRACE``; no suite runs such a thing.

Where: natively (bench/envs/native.py), on this node's ranks (children of mpirun: the
single-node launcher). Not yet inside a guest, where the agent runs mpirun
(bench/envs/guest_sampler.py): there the sample's ``--timeout`` still ends such a hang.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

GRACE = 5.0  # seconds after a rank ended that the rest are watched for work
IDLE_SHARE = 0.15  # a rank using less of one CPU than this is waiting, not working
LAUNCHERS = ("mpirun", "orterun", "mpiexec")  # comm prefixes of Open MPI's launcher
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat tells it."""

    pid: int
    ppid: int
    session: int
    comm: str
    state: str
    cpu_ticks: int  # utime + stime

    @property
    def running(self) -> bool:
        return self.state not in ("Z", "X")


def read_proc(pid: int) -> Proc | None:
    """``pid``'s stat, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return Proc(
        pid=pid,
        ppid=int(fields[1]),
        session=int(fields[3]),
        comm=comm,
        state=fields[0],
        cpu_ticks=int(fields[11]) + int(fields[12]),
    )


def session_processes(session: int) -> list[Proc]:
    """Every process (zombies included) of session ``session``."""
    found: list[Proc] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := read_proc(int(entry))) and proc.session == session:
            found.append(proc)
    return found


def rank_env(pid: int) -> dict[str, int]:
    """The ``OMPI_COMM_WORLD_*`` numbers Open MPI gave ``pid`` (RANK, LOCAL_SIZE...),
    read from its environment; empty when unreadable."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            key, _, value = item.partition(b"=")
            if key.startswith(b"OMPI_COMM_WORLD_") and value.isdigit():
                found[key.decode().removeprefix("OMPI_COMM_WORLD_")] = int(value)
    return found


def kill_session(session: int, sig: int = signal.SIGKILL) -> None:
    """``sig`` to every process of ``session``: mpirun puts its ranks in process groups
    of their own, so killing the leader's group would leave them running."""
    for proc in session_processes(session):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)


@dataclass
class RankWatch:
    """Watches the ranks of the mpirun in session ``session``; :meth:`stuck` says,
    polled now and then, when the run hangs (module doc). A rank that ended may have
    been reaped by mpirun before the first look: ranks are counted against the number
    mpirun started on this node (``OMPI_COMM_WORLD_LOCAL_SIZE``)."""

    session: int
    grace: float = GRACE
    idle_share: float = IDLE_SHARE
    ranks: dict[int, int | None] = field(default_factory=dict)  # pid -> MPI rank
    local_size: int | None = None
    _launched: float | None = None
    _since: float | None = None
    _ticks: dict[int, int] = field(default_factory=dict)

    def stuck(self, now: float | None = None) -> str | None:
        """None while the run may go on; else why it hangs (a phrase)."""
        now = time.monotonic() if now is None else now
        procs = session_processes(self.session)
        launchers = [p for p in procs if p.running and p.comm.startswith(LAUNCHERS)]
        if not launchers:
            self._since = None
            return None
        self._launched = now if self._launched is None else self._launched
        parents = {p.pid for p in launchers}
        live = {p.pid: p for p in procs if p.ppid in parents and p.running}
        for pid in live:
            if pid not in self.ranks:
                numbers = rank_env(pid)
                self.ranks[pid] = numbers.get("RANK")
                self.local_size = self.local_size or numbers.get("LOCAL_SIZE")
        if not self._short(len(live), now):
            self._since = None
            return None
        if self._since is None:
            self._since, self._ticks = now, {pid: p.cpu_ticks for pid, p in live.items()}
            return None
        window = now - self._since
        if window < self.grace:
            return None
        busy = [
            pid
            for pid, p in live.items()
            if (p.cpu_ticks - self._ticks.get(pid, p.cpu_ticks)) / _TICKS / window
            >= self.idle_share
        ]
        if busy:  # a rank works on after the others ended: watch another window
            self._since, self._ticks = now, {pid: p.cpu_ticks for pid, p in live.items()}
            return None
        return self._why(set(live), window)

    def _short(self, live: int, now: float) -> bool:
        """Whether fewer ranks run than mpirun started here (none at all, once mpirun
        has had ``grace`` seconds to start them, when their number was never seen)."""
        if self.local_size is not None:
            return live < self.local_size
        assert self._launched is not None
        return live == 0 and now - self._launched >= self.grace

    def _why(self, live: set[int], window: float) -> str:
        gone = sorted(r for pid, r in self.ranks.items() if pid not in live and r is not None)
        started = self.local_size or len(self.ranks)
        who = (
            f"rank {', '.join(map(str, gone))}"
            if gone
            else f"{started - len(live)} of {started} rank(s)"
            if started
            else "its ranks"
        )
        rest = f"{len(live)} rank(s) left idle (in MPI_Init)" if live else "no rank left"
        return (
            f"{who} ended and mpirun had not ended {window:.0f} s later, {rest}: Open MPI "
            "4.1's mpirun hangs when a rank fails before MPI_Init completes; the run was "
            "killed"
        )


_MPIRUN_LINE = re.compile(r"^\[[^\]]*:\d+\] |^-{10,}$")


def rank_lines(stderr: str, lines: int = 3) -> str:
    """The last ``lines`` lines of the ranks' own stderr, without mpirun's boxed notices
    and binding reports (what a failure record shows of the rank's own error)."""
    kept: list[str] = []
    in_box = False
    for raw in stderr.splitlines():
        line = raw.strip()
        if re.fullmatch(r"-{10,}", line):
            in_box = not in_box
            continue
        if line and not in_box and not _MPIRUN_LINE.match(line):
            kept.append(line)
    return " | ".join(kept[-lines:])
