"""One QMP command over a plain Unix socket, for the commands that must start fast:
``ps`` asking a VM's QEMU whether its vCPUs run, ``down`` asking it to quit.

Why not runtime/channels/qmp.py: its client, qemu.qmp, runs on asyncio, and importing
the two costs such a command about 0.02 s of its 0.1-0.2 s (docs/performance.md), for
one question and its answer. QMP is a line protocol (docs/interop/qmp-spec in QEMU):
QEMU greets a client with one JSON object (``{"QMP": ...}``) on a line, the client sends
``{"execute": "qmp_capabilities"}``, then its command, and reads lines until the one
that answers it (``return``, or ``error``), skipping the events QEMU sends meanwhile.

As ``qmp.execute``: every call its own connection (QEMU's QMP socket serves one client
at a time); ``timeout`` bounds connecting with the handshake, and then the command;
a RuntimeFailure naming the socket when QEMU cannot be reached or hangs up, or saying
what QEMU refused.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from hpcvm.errors import RuntimeFailure

_CHUNK = 65536


class _Lines:
    """The JSON objects QEMU sends, one a line, each read before a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def next(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            self.sock.settimeout(left)
            chunk = self.sock.recv(_CHUNK)
            if not chunk:
                raise EOFError("QEMU closed the connection")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError(f"not a QMP message: {line[:80]!r}")
        return message

    def answer(self, command: str, deadline: float) -> Any:
        """The value QEMU returns for ``command``; events before it skipped."""
        while True:
            message = self.next(deadline)
            if "return" in message:
                return message["return"]
            if "error" in message:
                error = message["error"]
                desc = error.get("desc", error) if isinstance(error, dict) else error
                raise RuntimeFailure(f"QEMU refused {command}: {desc}")


def execute(
    socket_path: str | Path,
    command: str,
    arguments: dict[str, object] | None = None,
    *,
    timeout: float = 10.0,
) -> Any:
    """Run one QMP command and return its value (module doc)."""
    request: dict[str, object] = {"execute": command}
    if arguments is not None:
        request["arguments"] = arguments
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            deadline = time.monotonic() + timeout
            sock.settimeout(timeout)
            sock.connect(str(socket_path))
            lines = _Lines(sock)
            if "QMP" not in lines.next(deadline):
                raise ValueError("no QMP greeting")
            sock.sendall(b'{"execute": "qmp_capabilities"}\n')
            lines.answer("qmp_capabilities", deadline)
            deadline = time.monotonic() + timeout
            sock.sendall(json.dumps(request).encode() + b"\n")
            return lines.answer(command, deadline)
    except (OSError, EOFError, ValueError) as exc:  # TimeoutError is an OSError
        detail = str(exc) or type(exc).__name__
        raise RuntimeFailure(f"cannot talk to QEMU over QMP at {socket_path}: {detail}") from exc
