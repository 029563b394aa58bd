"""Guest processes started through the agent: ending one with all it started, and
telling why a program did not start.

qemu-guest-agent has no kill and no "command not found": ``guest-exec`` gives a pid,
and a program that cannot start is an error whose text is GLib's. So both are asked of
the guest itself, with one more ``guest-exec`` of ``/bin/sh`` (POSIX sh and /proc only,
so any Linux guest can run it, the built-in one's static busybox included):

- ``END_SCRIPT`` sends SIGTERM to the process and its descendants (found from the
  parent pids in /proc, which every kernel has; /proc/PID/task/*/children needs
  CONFIG_PROC_CHILDREN), waits up to a bound for them to go, then sends SIGKILL to
  those left. The descendants are collected before the TERM: once a shell dies its
  children are reparented to init and could no longer be found from its pid.
- ``WHY_SCRIPT`` says whether the program exists where the agent looked (PATH for a
  bare name), as a shell decides 127 (not found) against 126 (found, cannot run).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.channels.agent_errors import (
    NOT_EXECUTABLE_EXIT,
    NOT_FOUND_EXIT,
    AgentCommandError,
    ProgramNotExecutable,
    ProgramNotFound,
)

if TYPE_CHECKING:
    from hpcvm.runtime.machine.model import ExecResult


class Agent(Protocol):
    """What this module asks of runtime/channels/agent.py's GuestAgent (which calls it)."""

    timeout: float

    def spawn(
        self,
        argv: list[str],
        *,
        input: bytes | None = None,
        env: list[str] | None = None,
        explain: bool = True,
    ) -> int: ...

    def exit_status(self, pid: int) -> ExecResult | None: ...


END_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
_TERM_ENDED = 0  # END_SCRIPT's exit codes: SIGTERM ended all
_KILL_SENT = 3  # some were left after the grace and got SIGKILL

# $1: the pid; $2: the grace in tenths of a second.
END_SCRIPT = r"""
top=$1 tenths=$2
map=$(for f in /proc/[0-9]*/stat; do
  IFS= read -r l 2>/dev/null <"$f" || continue
  r=${l##*) }; set -- $r; echo "${l%% *} $2"
done)
tree=$top new=$top
while [ -n "$new" ]; do
  next=
  for q in $new; do
    next="$next $(echo "$map" | while read -r p pp; do [ "$pp" = "$q" ] && echo "$p"; done)"
  done
  new=$(echo $next); tree="$tree $new"
done
alive() {
  for p in $tree; do
    IFS= read -r l 2>/dev/null </proc/$p/stat || continue
    r=${l##*) }; [ "${r%% *}" = Z ] || echo "$p"
  done
}
kill -TERM $tree 2>/dev/null
while [ "$tenths" -gt 0 ]; do
  [ -z "$(alive)" ] && exit 0
  sleep 0.1; tenths=$((tenths - 1))
done
left=$(alive); [ -z "$left" ] && exit 0
kill -KILL $left 2>/dev/null
exit 3
"""

# $1: the program as given. 127: not found; 126: found but not a runnable file; 0: it
# is one (then it failed to start for another reason: a shell says 126 too).
WHY_SCRIPT = r"""
case $1 in
  */*) [ -e "$1" ] || exit 127; [ -f "$1" ] && [ -x "$1" ] || exit 126 ;;
  *) command -v "$1" >/dev/null 2>&1 || exit 127 ;;
esac
exit 0
"""


def end(agent: Agent, pid: int, grace: float = END_GRACE) -> str:
    """End guest process ``pid`` and every process it started: SIGTERM, then SIGKILL
    for those still there ``grace`` seconds later. Returns what was done, as a phrase
    for a message ("was ended with SIGTERM"); never raises for a guest that does not
    answer (the phrase then says the process may still run)."""
    try:
        if agent.exit_status(pid) is not None:
            return "had already ended"
        killer = agent.spawn(
            ["/bin/sh", "-c", END_SCRIPT, "sh", str(pid), str(max(1, round(grace * 10)))],
            explain=False,
        )
        done = _wait(agent, killer, grace + 30.0)
        _wait(agent, pid, 5.0)  # collect its status: qemu-ga then forgets it
    except RuntimeFailure as exc:
        return f"may still be running in the guest ({exc})"
    if done is None:
        return "may still be running in the guest (the kill did not finish)"
    if done.exit_code == _TERM_ENDED:
        return "was killed with SIGTERM"
    if done.exit_code == _KILL_SENT:
        return f"was killed with SIGKILL (SIGTERM had not ended it within {grace:g} s)"
    return f"may still be running in the guest (the kill exited {done.exit_code})"


def _wait(agent: Agent, pid: int, limit: float) -> ExecResult | None:
    """The result of guest process ``pid``, or None if it runs ``limit`` s from now."""
    until = time.monotonic() + limit
    while True:
        status = agent.exit_status(pid)
        if status is not None or time.monotonic() >= until:
            return status
        time.sleep(0.05)


def why_not_started(agent: Agent, program: str, desc: str) -> AgentCommandError:
    """The error for ``program``, which the agent could not start (its error ``desc``):
    ProgramNotFound (127) or ProgramNotExecutable (126) as the guest says, else the
    agent's refusal as it came."""
    said = f"cannot run {program!r} in the guest: {desc}"
    try:
        probe = agent.spawn(["/bin/sh", "-c", WHY_SCRIPT, "sh", program], explain=False)
        found = _wait(agent, probe, agent.timeout)
    except RuntimeFailure:
        found = None
    code = found.exit_code if found is not None else None
    if code == NOT_FOUND_EXIT:
        if "/" in program:
            return ProgramNotFound(
                f"{program}: no such file in the guest (exit 127); the guest sees the "
                "host's system directories, the working directory and --share "
                "directories, each at its host path unless --share says otherwise",
                desc,
            )
        return ProgramNotFound(
            f"{program}: command not found in the guest's PATH (exit 127); give its full path",
            desc,
        )
    if code == NOT_EXECUTABLE_EXIT:
        return ProgramNotExecutable(
            f"{said}; it is not an executable file (exit 126): make it one (chmod +x) "
            "or run it through its interpreter",
            desc,
        )
    if code == 0:
        return ProgramNotExecutable(f"{said} (exit 126)", desc)
    return AgentCommandError(said, desc)
