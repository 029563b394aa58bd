"""A small synchronous client for qemu-guest-agent over its unix socket.

The protocol is QMP-like JSON, one object per line, but with no greeting and no
events, and the channel may hold stale replies: from a client that left before reading
its answer, or from commands written while the guest was still booting (the
virtio-serial port queues them until qemu-ga opens it). So every connection starts
with ``guest-sync`` carrying a random id, and replies are read until that id comes
back; only then is the channel known to be in step.

Where the VM has an agent relay (channels/agent_relay.py: it holds QEMU's socket so
that the agent stays awake between clients) a client connects to the relay's socket,
else to QEMU's. Either serves one client at a time: connect, do the work, close. A
second client's connect succeeds all the same (it waits in the socket's backlog until
the first leaves), so a busy agent would look like a silent one and, after the
timeout, like a dead VM. Every client therefore holds the agent's lock file beside the
socket (``<socket>.lock``, hpcvm.lock: dropped by the kernel with its holder) while it
is connected; a second client waits for it up to its timeout and then says the agent
is busy and who holds it (AgentBusy, exit 8: wait or retry), never that the VM died.
Every failure is a RuntimeFailure with a one-line message.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from hpcvm import lock
from hpcvm.errors import BusyError, RuntimeFailure
from hpcvm.runtime.channels.agent_errors import AgentCommandError as AgentCommandError
from hpcvm.runtime.channels.agent_errors import CommandTimedOut, ExecInterrupted, check_input
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine.exec_result import ExecResult
from hpcvm.signals import signals_deferred

_SYNC_ATTEMPT = 1.0  # seconds to wait for one guest-sync reply while the guest boots
_CONNECT_RETRY = 0.1
# guest-exec-status polling: short commands answer in 10-100 ms under TCG. Growing the
# wait by half (not doubling) finds such an end at most half its run late, for a few
# more asks of a few ms each; a long command is asked at most every _POLL_MAX.
_POLL_FIRST = 0.005
_POLL_GROWTH = 1.5
_POLL_MAX = 0.25
_SIGNALLED_POLL = 1.0  # status asked this often while a completion signal is awaited
_POLL_SIGNALLED = 0.005  # the first status poll after the signal (the exit follows it)
_READ_CHUNK = 48 * 1024  # guest-file-read count
_BUSY_RETRY = 0.2  # seconds between tries of a busy agent's lock
LOCK_SUFFIX = ".lock"  # the agent's lock file: the socket's path and this


class _Closed(Exception):
    """The agent's socket closed (QEMU exited or the guest went away)."""


class AgentGone(RuntimeFailure):
    """The connection to the agent dropped in the middle of a request."""


class AgentBusy(BusyError, RuntimeFailure):
    """Another client holds the agent (its socket serves one at a time): exit 8 (busy),
    and a RuntimeFailure for callers that give up on an agent that does not answer."""


def last_console_line(path: str | Path, tail: int = 4096) -> str:
    """The console's last non-empty line, printable and at most 200 characters.

    Why: an agent that never answers is most often a guest that stopped or hung in its
    boot, and the console's last line usually says where; naming it in the error saves
    the user (and a CI log) opening a file that may be gone by then.
    """
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = ["".join(c for c in line if c.isprintable()).strip() for line in text.splitlines()]
    found = [line for line in lines if line]
    return found[-1][:200] if found else ""


class GuestAgent:
    """One VM's guest agent at ``path`` (the QEMU chardev socket).

    ``timeout`` bounds each request's reply (and connecting); ``console_log`` is named
    in errors so a user knows where to look when the guest never answers.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float = 30.0,
        console_log: str | Path | None = None,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.console_log = str(console_log) if console_log else None
        self._sock: socket.socket | None = None
        self._buf = b""
        self._held: contextlib.ExitStack | None = None

    # -- connection ---------------------------------------------------------------------

    def __enter__(self) -> GuestAgent:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Drop the connection and the agent's lock (idempotent); the next request
        reconnects."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._buf = b""
        if self._held is not None:
            self._held.close()
            self._held = None

    def _hold(self) -> None:
        """Take the agent's lock (module doc), waiting up to ``timeout`` for another
        client to leave; AgentBusy naming it after that. Without a lock file this user
        may make (a directory not theirs), clients go on unlocked, as before."""
        if self._held is not None:
            return
        path = Path(f"{self.path}{LOCK_SUFFIX}")
        what = f"the guest agent at {self.path}"
        advice = (
            f"it serves one client at a time and was still held after {self.timeout:g} s; "
            "wait for that command to end, or retry"
        )
        deadline = time.monotonic() + self.timeout
        while True:
            held = contextlib.ExitStack()
            try:
                held.enter_context(lock.exclusive(path, what, advice, remove=True))
            except BusyError as exc:
                if time.monotonic() >= deadline:
                    raise AgentBusy(exc.message, cause="agent-busy") from exc
                time.sleep(_BUSY_RETRY)
                continue
            except OSError:
                return
            self._held = held
            return

    def _open(self) -> socket.socket:
        """Connect, through the VM's agent relay where it has one (it keeps the agent
        awake: channels/agent_relay.py), else to QEMU's socket itself."""
        self._hold()
        relay = paths.agent_relay(self.path)
        if relay is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout)
                sock.connect(str(relay))
                return sock
            except OSError:  # none, or gone: QEMU's socket serves as it did before
                sock.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            self.close()  # the lock too: nothing was connected
            raise
        return sock

    def _connected(self) -> socket.socket:
        """The connection, opened and synced if needed."""
        if self._sock is None:
            try:
                self._sock = self._open()
            except OSError as exc:
                raise RuntimeFailure(
                    f"cannot connect to the guest agent at {self.path}: "
                    f"{exc.strerror or type(exc).__name__}; is the VM running?"
                ) from exc
            try:
                if not self._sync(time.monotonic() + self.timeout):
                    raise RuntimeFailure(self._silent(f"within {self.timeout:g} s"))
            except _Closed as exc:
                self.close()
                raise AgentGone(
                    f"the guest agent at {self.path} closed the connection; is the VM running?"
                ) from exc
            except BaseException:
                self.close()
                raise
        return self._sock

    def _silent(self, when: str) -> str:
        where = (
            f"see the console log {self.console_log}"
            if self.console_log
            else ("see the VM's console log")
        )
        last = last_console_line(self.console_log) if self.console_log else ""
        said = f" (its last line: {last!r})" if last else ""
        return f"the guest agent at {self.path} did not answer {when}; {where}{said}"

    # -- wire ---------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            raise _Closed from exc

    def _receive(self, until: float) -> dict[str, Any] | None:
        """The next JSON object, or None when ``until`` (monotonic) passes first."""
        assert self._sock is not None
        while b"\n" not in self._buf:
            left = until - time.monotonic()
            if left <= 0:
                return None
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(1 << 20)
            except TimeoutError:
                return None
            except OSError as exc:
                raise _Closed from exc
            if not chunk:
                raise _Closed
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            value = json.loads(line.strip(b"\xff \r\t"))
        except ValueError:
            return {}  # noise from a half-written command; callers skip it
        return value if isinstance(value, dict) else {}

    def _sync(self, until: float) -> bool:
        """Send guest-sync with a fresh id and read until it comes back; False when
        ``until`` passes (the guest may still be booting: the caller may retry)."""
        ident = random.randrange(1, 2**31)
        # 0xFF first: qemu-ga discards any half-read command it holds.
        assert self._sock is not None
        try:
            self._sock.sendall(b"\xff")
        except OSError as exc:
            raise _Closed from exc
        self._send({"execute": "guest-sync", "arguments": {"id": ident}})
        while (reply := self._receive(until)) is not None:
            if reply.get("return") == ident:
                return True
        return False

    def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run one agent command and return its ``return`` value.

        RuntimeFailure when the agent reports an error, does not answer within the
        timeout, or the connection drops.
        """
        self._connected()
        message: dict[str, Any] = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        try:
            self._send(message)
            reply = self._receive(time.monotonic() + self.timeout)
        except _Closed as exc:
            self.close()
            raise AgentGone(
                f"the guest agent connection closed during {command}: the VM stopped?"
            ) from exc
        if reply is None:
            self.close()
            raise RuntimeFailure(self._silent(f"to {command} within {self.timeout:g} s"))
        if "error" in reply:
            desc = _error_desc(reply["error"])
            raise AgentCommandError(f"the guest agent refused {command}: {desc}", desc)
        return reply.get("return")

    # -- readiness ----------------------------------------------------------------------

    def wait_ready(self, deadline: float, is_alive: Callable[[], bool] = lambda: True) -> float:
        """Wait until the agent answers ``guest-sync``; the seconds it took.

        ``deadline`` is a ``time.monotonic()`` instant. Connecting and syncing are
        retried until then; ``is_alive`` (is QEMU still running?) is checked between
        attempts so a VM that died is reported at once, not at the deadline.
        """
        begin = time.monotonic()
        while True:
            if not is_alive():
                self.close()
                raise RuntimeFailure(self._silent("before the VM stopped"))
            now = time.monotonic()
            if now >= deadline:
                self.close()
                raise RuntimeFailure(self._silent(f"within {deadline - begin:.0f} s"))
            if self._sock is None:
                try:
                    self._sock = self._open()
                except OSError:
                    time.sleep(min(_CONNECT_RETRY, max(0.0, deadline - now)))
                    continue
            try:
                if self._sync(min(deadline, time.monotonic() + _SYNC_ATTEMPT)):
                    return time.monotonic() - begin
            except _Closed:
                self.close()
                time.sleep(_CONNECT_RETRY)

    def ping(self) -> None:
        self.call("guest-ping")

    def osinfo(self) -> dict[str, Any]:
        """guest-get-osinfo: kernel release, machine, distribution name and version."""
        info = self.call("guest-get-osinfo")
        return dict(info) if isinstance(info, dict) else {}

    # -- commands -----------------------------------------------------------------------

    def exec(
        self,
        argv: list[str],
        timeout: float | None = None,
        *,
        input: bytes | None = None,
        env: list[str] | None = None,
        finished: Callable[[float], bool] | None = None,
        poll_max: float | None = None,
    ) -> ExecResult:
        """Run ``argv`` in the guest (no shell; PATH is searched) and wait for it.

        stdout and stderr are decoded as UTF-8 (invalid bytes replaced). A process
        killed by a signal gets exit code 128 + signal, as a shell reports it. After
        ``timeout`` seconds, or when interrupted (KeyboardInterrupt: Ctrl-C, or SIGTERM
        where the caller turns it into one), the process and all it started are ended
        in the guest (SIGTERM, then SIGKILL: runtime/channels/guest_process.py), and
        CommandTimedOut ("timed out") or ExecInterrupted says so: no command is left
        running after its caller gave up on it. qemu-ga keeps at most 16 MiB of each
        stream.

        ``finished(seconds)``, where the command signals its own end (runtime/
        channels/completion.py), blocks up to ``seconds`` and says whether it has: the status is
        then asked once a second while it runs, instead of polling that backs off (to
        at most ``poll_max`` seconds between asks: a setup step someone waits for asks
        more often than a long benchmark, whose guest each ask disturbs; default 0.25 s).
        """
        begin = time.monotonic()
        pid: int | None = None
        try:
            with signals_deferred():  # a pid the agent gave must not be lost to a signal
                pid = self.spawn(argv, input=input, env=env)
            poll = _POLL_MAX if poll_max is None else poll_max
            status = self._wait_exit(pid, argv, begin, timeout, finished, poll)
        except KeyboardInterrupt as exc:
            if pid is None or isinstance(exc, ExecInterrupted):
                raise
            raise ExecInterrupted(f"{argv[0]!r} (pid {pid} in the guest) {self._end(pid)}") from exc
        except AgentGone as exc:
            raise AgentGone(
                f"the VM stopped while running {argv[0]!r} (the guest agent went away)"
            ) from exc
        return _result(status, time.monotonic() - begin)

    def _end(self, pid: int) -> str:
        """End ``pid`` and what it started in the guest after an interrupt (no signal
        cuts this short); what was done, as a phrase."""
        from hpcvm.runtime.channels.guest_process import end

        self.close()  # the interrupted request's reply may be on its way: sync afresh
        ended = "may still be running in the guest"
        # a second signal meanwhile: our caller raises the interrupt anyway
        with contextlib.suppress(KeyboardInterrupt), signals_deferred():
            ended = end(self, pid)
        return ended

    def spawn(
        self,
        argv: list[str],
        *,
        input: bytes | None = None,
        env: list[str] | None = None,
        explain: bool = True,
    ) -> int:
        """Start ``argv`` in the guest with its output captured; its guest pid. qemu-ga
        keeps the process's output and exit status in the guest's memory until
        :meth:`exit_status` has reported its end once: a detached ``cluster exec``
        outlives a checkpoint and restore of its VMs this way (cluster/commands/control.py).

        A program that does not start is ProgramNotFound (127) or ProgramNotExecutable
        (126) as the guest's own shell tells them apart (``explain``; runtime/
        channels/guest_process.py); ``input`` over MAX_INPUT bytes is InputTooLarge."""
        if not argv:
            raise RuntimeFailure("nothing to run in the guest: empty command")
        check_input(argv[0], input)
        args: dict[str, Any] = {"path": argv[0], "arg": list(argv[1:]), "env": env}
        if input is not None:
            args["input-data"] = base64.b64encode(input).decode()
        args = {k: v for k, v in args.items() if v is not None} | {"capture-output": True}
        try:
            started = self.call("guest-exec", args)
        except AgentCommandError as exc:
            desc = exc.desc.removeprefix("Guest agent command failed, error was ").strip("'")
            if not explain:
                raise AgentCommandError(
                    f"cannot run {argv[0]!r} in the guest: {desc}", desc
                ) from exc
            from hpcvm.runtime.channels.guest_process import why_not_started

            raise why_not_started(self, argv[0], desc) from exc
        return int(started["pid"])

    def exit_status(self, pid: int) -> ExecResult | None:
        """The result of guest process ``pid`` once it has exited (qemu-ga then forgets
        it), None while it runs."""
        status = self.call("guest-exec-status", {"pid": pid})
        if isinstance(status, dict) and status.get("exited"):
            return _result(status, 0.0)
        return None

    def _wait_exit(
        self,
        pid: int,
        argv: list[str],
        begin: float,
        timeout: float | None,
        finished: Callable[[float], bool] | None = None,
        poll_max: float = _POLL_MAX,
    ) -> dict[str, Any]:
        delay = _POLL_FIRST
        while True:
            if finished is not None:
                left = _SIGNALLED_POLL if timeout is None else timeout - (time.monotonic() - begin)
                if finished(max(0.0, min(_SIGNALLED_POLL, left))):
                    finished, delay = None, _POLL_SIGNALLED  # its exit is a moment away
            status = self.call("guest-exec-status", {"pid": pid})
            if isinstance(status, dict) and status.get("exited"):
                return status
            if timeout is not None and time.monotonic() - begin > timeout:
                from hpcvm.runtime.channels.guest_process import end

                ended = "may still be running in the guest"
                try:
                    with signals_deferred():
                        ended = end(self, pid)
                except KeyboardInterrupt as exc:  # came while it was being ended
                    raise ExecInterrupted(f"{argv[0]!r} (pid {pid} in the guest) {ended}") from exc
                raise CommandTimedOut(
                    f"{argv[0]!r} timed out after {timeout:g} s in the guest (pid {pid}) "
                    f"and {ended}",
                    ended,
                )
            if finished is None:
                time.sleep(delay)
                delay = min(delay * _POLL_GROWTH, poll_max)

    def read_file(self, path: str, *, limit: int = 64 << 20) -> bytes:
        """The bytes of a guest file (guest-file-open/read/close), up to ``limit``."""
        handle = self.call("guest-file-open", {"path": path, "mode": "r"})
        data = bytearray()
        try:
            while len(data) < limit:
                chunk = self.call("guest-file-read", {"handle": handle, "count": _READ_CHUNK})
                data += base64.b64decode(chunk.get("buf-b64", ""))
                if chunk.get("eof") or not chunk.get("count"):
                    break
        finally:
            with contextlib.suppress(RuntimeFailure):
                self.call("guest-file-close", {"handle": handle})
        return bytes(data[:limit])

    def shutdown(self, mode: str = "powerdown", *, wait: float = 3.0) -> None:
        """Ask the guest to power off (or ``halt``/``reboot``).

        qemu-ga answers only on failure; success shows as the connection closing when
        QEMU exits. Returns after that, or after ``wait`` seconds of silence; waiting
        for QEMU itself to exit is the caller's business.
        """
        self._connected()
        try:
            self._send({"execute": "guest-shutdown", "arguments": {"mode": mode}})
            until = time.monotonic() + wait
            while (reply := self._receive(until)) is not None:
                if "error" in reply:
                    desc = _error_desc(reply["error"])
                    raise AgentCommandError(f"the guest refused to shut down: {desc}", desc)
        except _Closed:
            pass
        finally:
            self.close()


def _error_desc(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("desc", error))
    return str(error)


def _text(status: dict[str, Any], key: str) -> str:
    raw = status.get(key)
    return base64.b64decode(raw).decode("utf-8", "replace") if raw else ""


def _result(status: dict[str, Any], seconds: float) -> ExecResult:
    signal = status.get("signal")
    code = status.get("exitcode")
    if code is None:
        code = 128 + int(signal) if signal is not None else -1
    return ExecResult(
        exit_code=int(code),
        stdout=_text(status, "out-data"),
        stderr=_text(status, "err-data"),
        signal=int(signal) if signal is not None else None,
        seconds=round(seconds, 6),
    )
