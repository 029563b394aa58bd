"""The guest agent's relay (runtime/channels/agent_relay.py) as a process, on real unix
sockets.

QEMU's agent socket cannot exist here without a VM, so a listening unix socket of the
test's stands in for it (said here: the relay only connects to it and passes bytes);
tests/integration/test_agent_busy.py checks the relay beside a real QEMU and guest
agent (QEMU's own ``query-chardev``, the user it runs as, ``exec`` without it).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcvm.runtime.channels import agent_relay


@dataclass
class Started:
    agent_end: socket.socket  # what the relay connected to (QEMU's side, here the test's)
    relay: Path
    pid: int


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Started]:
    qemu_side = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    qemu_side.bind(str(tmp_path / "agent.sock"))
    qemu_side.listen(1)
    relay = tmp_path / "relay.sock"
    pid = agent_relay.start(tmp_path / "agent.sock", relay, uid=None, gid=None)
    agent_end, _ = qemu_side.accept()
    qemu_side.close()
    agent_end.settimeout(10)
    try:
        yield Started(agent_end, relay, pid)
    finally:
        agent_end.close()
        agent_relay.ended(relay)


def _client(relay: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(relay))
    return sock


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_bytes_pass_both_ways_and_a_later_client_gets_only_its_own(started: Started) -> None:
    first = _client(started.relay)
    first.sendall(b'{"execute": "guest-sync"}\n')
    assert _read(started.agent_end, 26) == b'{"execute": "guest-sync"}\n'
    started.agent_end.sendall(b'{"return": 1}\n')
    assert _read(first, 14) == b'{"return": 1}\n'
    first.close()
    time.sleep(0.2)  # the relay sees the client leave
    started.agent_end.sendall(b'{"return": "late"}\n')  # nobody waits for it: dropped
    time.sleep(0.2)
    second = _client(started.relay)
    second.sendall(b"ping\n")
    assert _read(started.agent_end, 5) == b"ping\n"
    started.agent_end.sendall(b"pong\n")
    assert _read(second, 5) == b"pong\n"  # not the late reply before it
    second.close()


def test_a_large_request_arrives_whole(started: Started) -> None:
    """More than the relay queues before it stops reading (back-pressure, 1 MiB)."""
    payload = os.urandom(5 << 20)
    client = _client(started.relay)
    for source, sink in ((client, started.agent_end), (started.agent_end, client)):
        sender = threading.Thread(target=source.sendall, args=(payload,))
        sender.start()
        assert _read(sink, len(payload)) == payload
        sender.join()
    client.close()


def test_the_relay_ends_with_qemus_end_and_leaves_nothing(started: Started) -> None:
    assert _alive(started.pid)
    assert os.getppid() != started.pid and _parent(started.pid) != os.getpid()  # detached
    started.agent_end.close()  # QEMU exited
    assert not _ends_soon(started.pid)
    agent_relay.ended(started.relay)
    assert not started.relay.exists()
    assert not Path(f"{started.relay}{agent_relay.PID_SUFFIX}").exists()


def test_the_relays_files_are_its_owners_alone(started: Started) -> None:
    for path in (started.relay, Path(f"{started.relay}{agent_relay.PID_SUFFIX}")):
        assert path.stat().st_mode & 0o777 == 0o600, path


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can drop to another user")
def test_started_by_root_it_runs_as_the_user_given(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    qemu_side = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    qemu_side.bind(str(tmp_path / "agent.sock"))
    qemu_side.listen(1)
    relay = tmp_path / "relay.sock"
    pid = agent_relay.start(tmp_path / "agent.sock", relay, uid=65534, gid=65534)
    agent_end, _ = qemu_side.accept()
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        ids = {k: v.split() for k, v in (ln.split(":", 1) for ln in status.splitlines())}
        assert ids["Uid"] == ["65534"] * 4 and ids["Gid"] == ["65534"] * 4
        assert ids["Groups"] == []
        client = _client(relay)  # it serves with the sockets it was handed
        client.sendall(b"x\n")
        assert _read(agent_end, 2) == b"x\n"
        client.close()
    finally:
        agent_end.close()
        qemu_side.close()
        agent_relay.ended(relay)
    assert not _ends_soon(pid)


def _ends_soon(pid: int) -> bool:
    """Whether ``pid`` still runs after a short while: a process past ``ended`` may
    still be in its exit (its command line already empty) for a moment."""
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _alive(pid)


def test_a_socket_nobody_listens_on_starts_no_relay(tmp_path: Path) -> None:
    relay = tmp_path / "relay.sock"
    with pytest.raises(OSError):
        agent_relay.start(tmp_path / "agent.sock", relay, uid=None, gid=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
