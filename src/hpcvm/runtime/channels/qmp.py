"""A small synchronous face on qemu.qmp's asyncio ``QMPClient``.

The CLI is synchronous and each command talks to QEMU briefly, so every call opens a
connection, runs its commands and closes it: QEMU's QMP socket serves one client at a
time, and a connection held open by one ``hpcvm`` process would block all others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qemu.qmp import ConnectError, ExecuteError, QMPClient, QMPError

from hpcvm.errors import RuntimeFailure

QmpCommand = tuple[str, Mapping[str, object] | None]


async def _run(
    socket_path: str, commands: Sequence[QmpCommand], timeout: float, fd: int | None = None
) -> list[object]:
    client = QMPClient("hpcvm")
    try:
        await asyncio.wait_for(client.connect(socket_path), timeout)
        if fd is not None:
            client.send_fd_scm(fd)  # rides with the next command (QMP ``getfd``)
        results: list[object] = []
        for name, args in commands:
            results.append(await asyncio.wait_for(client.execute(name, args), timeout))
        return results
    finally:
        await client.disconnect()


def execute_many(
    socket_path: str | Path,
    commands: Sequence[QmpCommand],
    *,
    timeout: float = 10.0,
    fd: int | None = None,
) -> list[object]:
    """Run QMP ``commands`` in order on one connection; their return values. With
    ``fd``, that descriptor is passed to QEMU first (SCM_RIGHTS), for a first command
    ``getfd`` to name it.

    Raises RuntimeFailure naming the socket when QEMU cannot be reached or refuses.
    """
    try:
        return asyncio.run(_run(str(socket_path), commands, timeout, fd))
    except ExecuteError as exc:
        raise RuntimeFailure(f"QEMU refused {exc.sent['execute']}: {exc.error.error.desc}") from exc
    except (ConnectError, QMPError, OSError, EOFError, TimeoutError) as exc:
        detail = str(exc) or type(exc).__name__
        raise RuntimeFailure(f"cannot talk to QEMU over QMP at {socket_path}: {detail}") from exc


def execute(
    socket_path: str | Path,
    command: str,
    arguments: Mapping[str, object] | None = None,
    *,
    timeout: float = 10.0,
) -> Any:
    """Run one QMP command and return its value (usually a dict or list)."""
    return execute_many(socket_path, [(command, arguments)], timeout=timeout)[0]
