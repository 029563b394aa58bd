"""QMP over a plain socket (runtime/channels/qmp_line.py) answers as the qemu.qmp
client of runtime/channels/qmp.py does: the command's value, events skipped, QEMU's
refusal in its words, and a one-line RuntimeFailure naming the socket when QEMU hangs
up, says no QMP, cannot be reached or does not answer in time. A server in a thread
plays QEMU, one scripted connection per test; the stand-in of tests/qemu_standin.py
is the oracle both clients must agree on."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.channels import qmp, qmp_line
from tests.qemu_standin import standin_qemu

GREETING = b'{"QMP": {"version": {}, "capabilities": []}}\r\n'

Script = Callable[[socket.socket], None]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Callable[[Script], Path]]:
    """``serve(script)``: a socket whose first client ``script`` talks to."""
    threads: list[threading.Thread] = []

    def serve(script: Script) -> Path:
        path = tmp_path / "qmp.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(1)

        def run() -> None:
            conn, _ = listener.accept()
            with conn, listener:
                script(conn)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        return path

    yield serve
    for thread in threads:
        thread.join(timeout=10)


def _replies(*lines: bytes) -> Script:
    """Greet, then answer each line the client sends with the next of ``lines``; then
    read one more (the client's command) and hang up."""

    def script(conn: socket.socket) -> None:
        conn.sendall(GREETING)
        stream = conn.makefile("rb")
        for line in lines:
            stream.readline()
            conn.sendall(line)
        stream.readline()

    return script


def test_the_value_comes_back_and_events_are_skipped(server: Callable[[Script], Path]) -> None:
    path = server(
        _replies(
            b'{"return": {}}\r\n',
            b'{"event": "STOP", "data": {}}\r\n'
            b'{"return": {"status": "paused", "running": false}}\r\n',
        )
    )
    assert qmp_line.execute(path, "query-status") == {"status": "paused", "running": False}


def test_a_refusal_says_what_qemu_said(server: Callable[[Script], Path]) -> None:
    path = server(
        _replies(
            b'{"return": {}}\r\n',
            b'{"error": {"class": "CommandNotFound", '
            b'"desc": "The command x has not been found"}}\r\n',
        )
    )
    with pytest.raises(RuntimeFailure) as info:
        qmp_line.execute(path, "x")
    assert str(info.value) == "QEMU refused x: The command x has not been found"


@pytest.mark.parametrize(
    ("script", "words"),
    [
        (lambda conn: None, "QEMU closed the connection"),
        (lambda conn: conn.sendall(b'{"hello": 1}\r\n'), "no QMP greeting"),
        (lambda conn: conn.sendall(b"[1, 2]\r\n"), "not a QMP message"),
        (_replies(b'{"return": {}}\r\n'), "QEMU closed the connection"),
    ],
    ids=["hangs-up", "no-greeting", "not-an-object", "hangs-up-after-handshake"],
)
def test_a_broken_conversation_is_one_line_naming_the_socket(
    server: Callable[[Script], Path], script: Script, words: str
) -> None:
    path = server(script)
    with pytest.raises(RuntimeFailure) as info:
        qmp_line.execute(path, "query-status")
    assert str(info.value).startswith(f"cannot talk to QEMU over QMP at {path}: {words}")


def test_no_socket_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure) as info:
        qmp_line.execute(tmp_path / "none.sock", "quit")
    assert str(info.value).startswith(f"cannot talk to QEMU over QMP at {tmp_path / 'none.sock'}: ")


def test_a_silent_qemu_times_out(server: Callable[[Script], Path]) -> None:
    path = server(lambda conn: time.sleep(1.5))
    begin = time.monotonic()
    with pytest.raises(RuntimeFailure) as info:
        qmp_line.execute(path, "query-status", timeout=0.5)
    assert "timed out" in str(info.value) and time.monotonic() - begin < 1.4


@pytest.mark.parametrize("running", [True, False])
def test_both_clients_read_the_same_answers(tmp_path: Path, running: bool) -> None:
    with standin_qemu(tmp_path / "qmp.sock", running=running) as _qemu:
        light = qmp_line.execute(tmp_path / "qmp.sock", "query-status", timeout=5.0)
        assert light == qmp.execute(tmp_path / "qmp.sock", "query-status", timeout=5.0)
        assert light["running"] is running
        refusals = []
        for client in (qmp_line.execute, qmp.execute):
            with pytest.raises(RuntimeFailure) as info:
                client(tmp_path / "qmp.sock", "no-such-command")
            refusals.append(str(info.value))
        assert (
            refusals[0] == refusals[1] == "QEMU refused no-such-command: no command no-such-command"
        )
