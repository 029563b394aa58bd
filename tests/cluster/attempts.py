"""What a second user tries against another user's running job, and the OS's answer to
each: run as that user on a node by tests/integration/test_two_users.py.

Standard library only, and nothing of hpcvm: the answers are the kernel's. Reads a JSON
list of ``[label, action, target...]`` from argv[1] and prints one JSON object, label ->
"ok" when the attempt succeeded or the errno's name (EACCES, EPERM...) when it failed.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import sys
from collections.abc import Callable


def _read(path: str) -> None:
    with open(path, "rb") as fh:
        fh.read(1)


def _write(path: str) -> None:
    with open(path, "ab") as fh:
        fh.write(b"")


def _connect(path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)


ACTIONS: dict[str, Callable[..., object]] = {
    "read": _read,
    "write": _write,
    "list": os.listdir,
    "mkdir": os.mkdir,
    "rename": os.rename,
    "unlink": os.unlink,
    "connect": _connect,
    "kill": lambda pid: os.kill(int(pid), signal.SIGKILL),
}


def main() -> int:
    answers = {}
    for label, action, *targets in json.loads(sys.argv[1]):
        try:
            ACTIONS[action](*targets)
            answers[label] = "ok"
        except OSError as exc:
            answers[label] = errno.errorcode.get(exc.errno or 0, str(exc))
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
