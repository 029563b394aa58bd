"""The connection a live migration runs over: one TCP connection between the two nodes'
hpcvm tasks, authenticated both ways before QEMU gets it.

QEMU's own ``tcp:`` migration listens for anyone: whoever connects first feeds the
waiting QEMU a machine state, and QEMU cannot tell who sent it. hpcvm therefore makes
the connection itself, as it opens a checkpoint's files itself (checkpoint/qemu_state.py):
the target node's task listens, the source node's task connects, each proves that it
knows the job's migration secret (HMAC-SHA256 over both sides' fresh nonces, so a
recorded exchange cannot be replayed), they agree on what moves (framed messages),
and only then does each hand its end of the connection to its QEMU as a descriptor.
The secret is made by ``cluster up`` and reaches the nodes' tasks in their
environment, never on a command line. The stream itself is not encrypted (as QEMU's
and libvirt's migrations are not without TLS): it is the job's network.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import time
from typing import Any

from hpcvm.errors import RuntimeFailure

NONCE_BYTES = 32
MAX_MESSAGE = 64 * 1024 * 1024  # bytes: an offer with its seed image is far smaller
HANDSHAKE_TIMEOUT = 10.0  # seconds for the whole handshake
_LENGTH = struct.Struct("!Q")


class ChannelError(RuntimeFailure):
    """The peer did not prove the secret, or broke the protocol."""


def new_secret() -> str:
    return secrets.token_hex(32)


def _mac(secret: str, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(_key(secret), role + first + second, hashlib.sha256).digest()


def _key(secret: str) -> bytes:
    key = bytes.fromhex(secret)
    if len(key) < NONCE_BYTES:
        raise ChannelError(
            "no migration secret (or a short one): the job was not started by cluster up"
        )
    return key


def accept_peer(conn: socket.socket, secret: str) -> None:
    """The listening side's half of the handshake; ChannelError when the peer does not
    know ``secret``, or takes longer than HANDSHAKE_TIMEOUT in all (a peer that trickles
    bytes cannot hold the listener)."""
    _key(secret)
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT
    conn.settimeout(HANDSHAKE_TIMEOUT)
    ours = secrets.token_bytes(NONCE_BYTES)
    conn.sendall(ours)
    theirs = recv_exact(conn, NONCE_BYTES, deadline)
    proof = recv_exact(conn, hashlib.sha256().digest_size, deadline)
    if not hmac.compare_digest(proof, _mac(secret, b"source", ours, theirs)):
        raise ChannelError("a connection did not prove the job's migration secret; dropped")
    conn.sendall(_mac(secret, b"target", ours, theirs))


def connect_peer(conn: socket.socket, secret: str) -> None:
    """The connecting side's half; ChannelError when the listener does not know
    ``secret`` (it is not the job's spare node)."""
    _key(secret)
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT
    conn.settimeout(HANDSHAKE_TIMEOUT)
    theirs = recv_exact(conn, NONCE_BYTES, deadline)
    ours = secrets.token_bytes(NONCE_BYTES)
    conn.sendall(ours + _mac(secret, b"source", theirs, ours))
    proof = recv_exact(conn, hashlib.sha256().digest_size, deadline)
    if not hmac.compare_digest(proof, _mac(secret, b"target", theirs, ours)):
        raise ChannelError("the target node did not prove the job's migration secret")


def send_message(conn: socket.socket, header: dict[str, Any], blob: bytes = b"") -> None:
    """One message: a JSON header and an optional blob, each length-prefixed."""
    text = json.dumps(header).encode()
    conn.sendall(_LENGTH.pack(len(text)) + text + _LENGTH.pack(len(blob)) + blob)


def recv_message(conn: socket.socket) -> tuple[dict[str, Any], bytes]:
    """The next message; read exactly, so that nothing of what follows (QEMU's stream)
    is consumed here."""
    header = json.loads(recv_exact(conn, _length(conn)))
    if not isinstance(header, dict):
        raise ChannelError("the peer sent a message that is not a JSON object")
    return header, recv_exact(conn, _length(conn))


def _length(conn: socket.socket) -> int:
    (size,) = _LENGTH.unpack(recv_exact(conn, _LENGTH.size))
    if size > MAX_MESSAGE:
        raise ChannelError(f"the peer announced a {size}-byte message; at most {MAX_MESSAGE}")
    return int(size)


def recv_exact(conn: socket.socket, size: int, deadline: float | None = None) -> bytes:
    """Exactly ``size`` bytes; by ``deadline`` (time.monotonic) when given."""
    parts = bytearray()
    while len(parts) < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelError("the peer took too long over the handshake")
            conn.settimeout(left)
        try:
            chunk = conn.recv(size - len(parts))
        except TimeoutError:
            if deadline is not None:
                raise ChannelError(
                    "the peer took too long over the migration's handshake"
                ) from None
            raise ChannelError("the peer stopped answering during the migration's setup") from None
        if not chunk:
            raise ChannelError("the peer closed the connection during the migration's setup")
        parts += chunk
    return bytes(parts)


CHUNK = 1 << 20


def send_file(conn: socket.socket, path: str) -> int:
    """Send the file at ``path``: its size, its bytes, then their SHA-256, which the
    receiver checks; the bytes sent."""
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        size = os.fstat(source.fileno()).st_size
        send_message(conn, {"size": size})
        left = size
        while left > 0:
            chunk = source.read(min(CHUNK, left))
            if not chunk:
                raise ChannelError(f"{path} shrank while it was sent")
            digest.update(chunk)
            conn.sendall(chunk)
            left -= len(chunk)
    send_message(conn, {"sha256": digest.hexdigest()})
    return size


def recv_file(conn: socket.socket, path: str) -> int:
    """Receive ``send_file``'s file over the existing file at ``path`` (rewritten in
    place, so whoever holds it open reads the new bytes), synced; ChannelError when
    its SHA-256 is not the one announced. The bytes received."""
    header, _ = recv_message(conn)
    size = int(header["size"])
    digest = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        left = size
        while left > 0:
            chunk = conn.recv(min(CHUNK, left))
            if not chunk:
                raise ChannelError("the source closed the connection in the middle of the disk")
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            left -= len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    trailer, _ = recv_message(conn)
    if trailer.get("sha256") != digest.hexdigest():
        raise ChannelError("the disk overlay arrived damaged (its SHA-256 differs)")
    return size
