"""hpcvm's own virtio-serial port: how a guest process tells the host it is done.

qemu-guest-agent has no event for a finished ``guest-exec``: the host can only ask
(``guest-exec-status``), and every question wakes the guest's agent while the command
it waits for runs; asked rarely, the answer comes late (polling that backed off to
0.25 s cost a bench sample 0.1 s on average). So the runtime gives every VM a second
virtio-serial port (``BootSpec.done_socket``, named ``org.hpcvm.done.0``), and a guest
process that wants to be waited for writes a token line to it as it exits (bench/envs/vm.py's
sample script, from an EXIT trap). The host waits for that token on the port's unix
socket, asleep, and then asks the agent once for the exit status.

A guest's write to a virtio-serial port blocks while no host end is connected, so the
host connects before it starts the command and stays connected. Tokens from earlier
commands (a sample the host gave up on) are read and skipped.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path


class CompletionPort:
    """The host end of one VM's completion port (a client of QEMU's chardev socket)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sock: socket.socket | None = None
        self._buf = b""

    def connect(self) -> bool:
        """Connect once; False when the VM has no such port (an older record, a socket
        another client holds is still a connection: QEMU serves one at a time)."""
        if self._sock is not None:
            return True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            return False
        self._sock, self._buf = sock, b""
        return True

    def wait(self, token: str, seconds: float) -> bool:
        """Block until the line ``token`` arrives or ``seconds`` pass (False). A port
        that is closed answers True at once too: there is nothing more to wait for on
        it, and the caller asks the agent as it would without one."""
        if self._sock is None:
            return True
        until = time.monotonic() + seconds
        wanted = token.encode()
        while True:
            while b"\n" in self._buf:
                line, _, self._buf = self._buf.partition(b"\n")
                if line.strip() == wanted:
                    return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(4096)
            except TimeoutError:
                return False
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                return True
            self._buf += chunk

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock, self._buf = None, b""
