"""The guest agent's holder: one connection to qemu-guest-agent kept for the VM's life.

qemu-guest-agent on a virtio-serial port cannot wait for a host to connect: while no
client is connected to QEMU's end, its reads return end-of-file and it sleeps 100 ms
after each before it reads again (QEMU's qga/main.c, ``channel_event_cb``). A client
that connects after another left therefore finds the agent asleep and waits 0-100 ms
for its first answer: a ``guest-sync`` on a fresh connection took 52.7 ms (median of 15,
0.15 s apart; 8.6-75.2 ms), on a connection held open 4.2 ms (1.5-12.2), under TCG
here. It is a sleep, not emulated work, so a KVM guest pays it too. Every ``hpcvm
exec`` is a new client, and scripts call exec in loops.

So, as libvirtd holds each domain's agent channel, the runtime starts beside each QEMU
of its own backend this relay: a small process that holds QEMU's agent socket open
and serves hpcvm's clients on ``relay.sock`` in the VM's private directory, one at a
time (others wait in the listen backlog, as they did on QEMU's socket; the agent's lock
file still orders them, channels/agent.py). It passes bytes both ways and parses
nothing: every client still starts with 0xFF and ``guest-sync`` and skips what a
client before it left unread, and what the agent says while no client is connected is
read and dropped. A client that finds no relay (a VM started by an earlier hpcvm, a
backend without one, a relay gone) connects to QEMU's socket as before.

The runtime hands the relay both sockets open (the listening one bound, 0600, in the
VM's 0700 directory) and, when hpcvm runs as root, the relay drops to QEMU's own user
before it reads a byte: the guest (whose root may be anyone's) talks to no process of
root's through it. It detaches (a second fork, so no hpcvm process is left with a
zombie), and ends when QEMU's end closes: QEMU exited. ``start`` and ``ended`` are the
runtime's two calls; ``main`` is the relay.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hpcvm.procs import pid_alive

PID_SUFFIX = ".pid"  # the relay's pid, beside its socket: relay.sock.pid
_CHUNK = 1 << 16
_PENDING_MAX = 1 << 20  # bytes queued towards one side before reading the other stops
_END_WAIT = 2.0  # seconds for a relay to end once QEMU has (it ends at once on the EOF)
_MODULE = "hpcvm.runtime.channels.agent_relay"


def start(agent_socket: Path, relay_socket: Path, *, uid: int | None, gid: int | None) -> int:
    """Start the relay for QEMU's agent socket, listening on ``relay_socket``; its pid.

    ``uid``/``gid``: the user it drops to (QEMU's), when hpcvm is root. Raises OSError
    when QEMU's socket does not take the connection (the caller goes on without a relay:
    clients then connect to QEMU's socket)."""
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pid_file = Path(f"{relay_socket}{PID_SUFFIX}")
    try:
        agent.connect(str(agent_socket))
        relay_socket.unlink(missing_ok=True)
        listener.bind(str(relay_socket))
        relay_socket.chmod(0o600)  # before it listens; in the VM's 0700 directory
        listener.listen(8)
        fds = (listener.fileno(), agent.fileno())
        argv = [sys.executable, "-m", _MODULE, *map(str, fds)]
        if uid is not None and gid is not None:
            argv += [str(uid), str(gid)]
        first = subprocess.run(
            [*argv, str(pid_file)],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            check=False,
        )
        if first.returncode != 0:
            raise OSError(f"the agent relay did not start (exit {first.returncode})")
        return int(pid_file.read_text())
    except BaseException:
        relay_socket.unlink(missing_ok=True)
        pid_file.unlink(missing_ok=True)
        raise
    finally:
        agent.close()
        listener.close()


def ended(relay_socket: Path) -> None:
    """After QEMU is gone: wait for its relay to end (it does on QEMU's EOF), SIGKILL it
    after ``_END_WAIT``, and remove its socket and pid file. Nothing is left running
    or lying in the VM's directory when ``down`` returns."""
    pid_file = Path(f"{relay_socket}{PID_SUFFIX}")
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        pid = 0
    if pid > 0 and _is_relay(pid):
        deadline = time.monotonic() + _END_WAIT
        while _is_relay(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if _is_relay(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for path in (relay_socket, pid_file):
        path.unlink(missing_ok=True)


def _is_relay(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) agent relay: a reused pid is not killed."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return _MODULE.encode() in cmdline and pid_alive(pid)


# -- the relay ----------------------------------------------------------------------------


class _Relay:
    """The byte pump: QEMU's agent end, the listening socket, at most one client."""

    def __init__(self, listener: socket.socket, agent: socket.socket) -> None:
        self.listener, self.agent = listener, agent
        self.client: socket.socket | None = None
        self.to_agent = b""
        self.to_client = b""
        self.poll = select.poll()
        for sock in (listener, agent):
            sock.setblocking(False)

    def run(self) -> None:
        """Pump until QEMU's end closes."""
        while True:
            self._arm()
            for fd, events in self.poll.poll():
                if fd == self.agent.fileno():
                    readable = events & (select.POLLIN | select.POLLHUP | select.POLLERR)
                    if readable and not self._from_agent():
                        return
                    if events & select.POLLOUT:
                        self._flush_agent()
                elif fd == self.listener.fileno():
                    self._accept()
                elif self.client is not None and fd == self.client.fileno():
                    if events & select.POLLOUT:
                        self._flush_client()
                    if self.client is not None and events & ~select.POLLOUT:
                        self._from_client()

    def _arm(self) -> None:
        """Say what to wait for (poll's register updates a registered fd): read a side
        only while little is queued towards the other (back-pressure); accept only while
        no client is connected."""
        agent = select.POLLOUT if self.to_agent else 0
        if len(self.to_client) < _PENDING_MAX:
            agent |= select.POLLIN
        self.poll.register(self.agent, agent)
        self.poll.register(self.listener, select.POLLIN if self.client is None else 0)
        if self.client is not None:
            client = select.POLLOUT if self.to_client else 0
            if len(self.to_agent) < _PENDING_MAX:
                client |= select.POLLIN
            self.poll.register(self.client, client)

    def _from_agent(self) -> bool:
        try:
            data = self.agent.recv(_CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False  # QEMU exited
        if self.client is not None:
            self.to_client += data
        return True  # with no client: dropped (a reply nobody waits for)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            client, _ = self.listener.accept()
            client.setblocking(False)
            self.client, self.to_client = client, b""

    def _from_client(self) -> None:
        assert self.client is not None
        try:
            data = self.client.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop_client()
            return
        self.to_agent += data

    def _flush_agent(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self.to_agent = self.to_agent[self.agent.send(self.to_agent) :]

    def _flush_client(self) -> None:
        assert self.client is not None
        try:
            self.to_client = self.to_client[self.client.send(self.to_client) :]
        except BlockingIOError:
            pass
        except OSError:
            self._drop_client()

    def _drop_client(self) -> None:
        """The client left: what it sent goes on to the agent; what was on its way to
        it is dropped (the next client's guest-sync skips the rest)."""
        if self.client is not None:
            self.poll.unregister(self.client)
            self.client.close()
        self.client, self.to_client = None, b""


def main(argv: list[str]) -> int:
    """``LISTEN_FD AGENT_FD [UID GID] PID_FILE``: detach, drop to UID:GID, pump."""
    listen_fd, agent_fd = int(argv[0]), int(argv[1])
    ids = (int(argv[2]), int(argv[3])) if len(argv) == 5 else None
    pid = os.fork()
    if pid:
        fd = os.open(argv[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"{pid}\n")
        return 0
    if ids is not None:
        os.setgroups([])
        os.setgid(ids[1])
        os.setuid(ids[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    listener = socket.socket(fileno=listen_fd)
    agent = socket.socket(fileno=agent_fd)
    with contextlib.suppress(OSError):
        _Relay(listener, agent).run()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
