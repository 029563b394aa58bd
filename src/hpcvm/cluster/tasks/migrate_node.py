"""The two node sides of ``cluster migrate``: a spare node's task that takes a VM in,
and the one-task step on the VM's node that sends it.

A spare node's task (a task of the holder step like any other, cluster/tasks/node.py) listens
on its node's address on the job's network and reports ``spare`` with where. The
client (cluster/commands/migrate.py) starts the source step on the VM's node, which connects,
proves the job's secret (runtime/migration/channel.py), names the VM's index in the
job, and migrates the VM (runtime/migration/move.py). The spare re-plans it for its own
node, takes it in under its own node's VM name (keeping the VM's MAC and address), and
from then on holds it as its node's VM: it reports ``ready`` for that index. The
source step leaves a marker in the old VM's run directory; the old node's task, which
sees its QEMU end, finds the marker, tears down what is left, reports ``migrated`` and
becomes a spare itself.

The source step prints one result line and exits 0, as a checkpoint phase does
(cluster/tasks/checkpoint_node.py).
"""

from __future__ import annotations

import functools
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from ipaddress import IPv4Interface
from typing import TypeVar

from hpcvm import procs
from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.tasks.addresses import Claim, claim
from hpcvm.cluster.tasks.checkpoint_node import NodeResult, report
from hpcvm.cluster.tasks.moved import (
    MARKER,
    Moving,
    Phase,
    clear_moving,
    marker_path,
    moving_path,
    read_moving,
    resume_or_stop,
    settled_path,
    write_moving,
)
from hpcvm.errors import HpcvmError, RuntimeFailure, UsageError
from hpcvm.model import Frozen
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.migration import move as migration
from hpcvm.runtime.migration.channel import (
    ChannelError,
    accept_peer,
    connect_peer,
    recv_message,
    send_message,
)
from hpcvm.signals import interrupting

SECRET_ENV = "HPCVM_MIGRATION_SECRET"
# PHASE:SECONDS: the source step waits that long when it reaches PHASE (sending,
# paused, go, told: cluster/tasks/moved.py), a window in which the fault tests kill a step
# (tests/integration/test_cluster_migrate.py, test_cluster_checkpoint.py); unset, none.
HOLD_ENV = "HPCVM_MIGRATE_HOLD"
CONNECT_TIMEOUT = 30.0
CLAIM_WAIT = 30.0  # seconds for the old node to release the VM's address claim
_ACCEPT_POLL = 0.5


class MigrateRequest(Frozen):
    """What the source step's task is asked."""

    batch: str
    vm: str  # the VM's name on the source node
    index: int  # its index in the job
    target: str  # HOST:PORT where the spare node's task listens
    move: str = ""  # this move's id: in the marker, and in the target's events about it


# -- the spare (target) side -----------------------------------------------------------


class Listener:
    """A spare node's listening socket on its node's address on the job's network."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(_ACCEPT_POLL)

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def accept_peer(
        self, secret: str, source: str, first: socket.socket | None = None
    ) -> socket.socket:
        """The source's next connection (its disk, runtime/migration/move.py), from the
        source's address and authenticated; others are dropped and waited past. When
        the source's ``first`` connection closes meanwhile, the source is gone (its
        step killed after QEMU's pass): ChannelError at once, so that this node tears
        its copy down and listens again, rather than take the next migration from that
        node for this one's disk (the fault suite found the keeper's move then refused)."""
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while time.monotonic() < deadline:
            if first is not None and _closed(first):
                raise ChannelError(f"the source {source} went before it sent the disk")
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            try:
                if peer[0] != source:
                    raise ChannelError(f"a connection from {peer[0]}, not the source {source}")
                accept_peer(conn, secret)
            except (ChannelError, OSError):
                conn.close()
                continue
            return conn
        raise ChannelError(f"the source did not connect again within {CONNECT_TIMEOUT:g} s")

    def close(self) -> None:
        self.sock.close()


def _closed(conn: socket.socket) -> bool:
    """Whether the peer closed ``conn`` (end of stream or reset), without reading
    anything it may still send."""
    readable, _, _ = select.select([conn], [], [], 0)
    if not readable:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


Say = Callable[[str], None]


def take_in(
    listener: Listener,
    secret: str,
    name: str,
    stop: threading.Event,
    say: Say,
    relisten: Callable[[str], None] = lambda _move: None,
) -> tuple[Machine, int, str | None] | None:
    """Wait for a VM to migrate in and take it as ``name``; its index in the job and
    its address (claimed by ``claim_moved`` once the VM is reported ready: the old
    node may release it only then). None when ``stop`` is set first. A connection that
    does not prove ``secret``, or a migration that fails, is said and waited past: the
    VM runs on at its source. After a failed migration ``relisten(move)`` reports this
    node a spare again with that move's id, which tells ``cluster migrate`` the VM does
    not run here; a connection that never named a move says nothing."""
    while not stop.is_set():
        try:
            conn, peer = listener.sock.accept()
        except TimeoutError:
            continue
        with conn:
            try:
                accept_peer(conn, secret)
                header, _ = recv_message(conn)
                index, move = int(header["index"]), str(header.get("move", ""))
            except (HpcvmError, OSError, KeyError, ValueError) as exc:
                say(f"a connection from {peer[0]} was dropped before any migration: {exc}")
                continue
            try:
                with interrupting(signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    again = functools.partial(listener.accept_peer, secret, str(peer[0]), conn)
                    machine, made = migration.receive(conn, name, again, warn=say)
            except (HpcvmError, OSError, KeyError, ValueError) as exc:
                say(f"a migration from {peer[0]} did not complete: {exc}")
                relisten(move)  # said as an event: cluster migrate learns it is not here
                continue
            except KeyboardInterrupt:
                return None
        return machine, index, made.options.address
    return None


def claim_moved(address: str | None, say: Say) -> Claim | None:
    """The moved-in VM's address claimed on this node. On nodes that share one claims
    directory (one machine), the old node releases it only once its QEMU is gone: wait
    for that."""
    if address is None:
        return None
    wanted = IPv4Interface(address)
    deadline = time.monotonic() + CLAIM_WAIT
    while time.monotonic() < deadline:
        got = claim(wanted)
        if got is not None:
            return got
        time.sleep(0.2)
    say(f"the address {wanted.ip} of the migrated VM stays claimed by another process here")
    return None


# -- the source side -------------------------------------------------------------------


def run_source(request_json: str) -> int:
    """The source step's task: migrate this node's VM and print the result line. A
    SIGTERM before the target is told to run the VM resumes it here (migration.send)."""
    request = _request(MigrateRequest, request_json)
    node = get_batch(request.batch).this_node(os.environ)

    def act() -> NodeResult:
        with interrupting(signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            return _send(request, node)

    return report(node, act)


def _send(request: MigrateRequest, node: str) -> NodeResult:
    from hpcvm.runtime.machine import state as vm_state

    secret = os.environ.get(SECRET_ENV, "")
    if not secret:
        raise UsageError("the source step is started by hpcvm cluster migrate, not by hand")
    machine = vm_state.load_machine(request.vm)
    me = os.getpid()
    started = procs.process_start_time(me) or time.time()

    def mark(now: Phase) -> None:
        moving = Moving(
            pid=me, started=started, node=node, target=request.target, phase=now,
            move=request.move,
        )  # fmt: skip
        write_moving(machine.name, moving)

    def phase(now: Phase) -> None:
        """Where the move is, in the VM's ``moving`` marker (cluster/tasks/moved.py)."""
        mark(now)
        _hold(now)

    mark("sending")
    try:
        with _connect(request.target, secret) as conn:
            send_message(conn, {"index": request.index, "move": request.move})
            sent = migration.send(machine, conn, lambda: _connect(request.target, secret), phase)
    except migration.MoveUnknown:
        raise  # the marker says "go": the node's task says so should this step die
    except BaseException:
        clear_moving(machine.name)  # send() resumed the VM here
        raise
    _mark_moved(machine, request.target)  # the node's task then stops the paused QEMU here
    clear_moving(machine.name)
    return NodeResult(
        node=node,
        ok=True,
        state_bytes=sent.ram_bytes,
        disk_bytes=sent.disk_bytes,
        downtime_ms=sent.downtime_ms,
        disk_ms=sent.disk_ms,
        total_ms=sent.total_ms,
    )


_R = TypeVar("_R", bound=Frozen)


def _request(kind: type[_R], text: str) -> _R:
    """A step's request, or one line saying it is not one (these steps are started by
    cluster migrate: a hand-made argument is the only way to get here)."""
    try:
        return kind.model_validate_json(text)
    except ValueError as exc:
        raise UsageError(
            f"not a {kind.__name__} as cluster migrate writes it: these steps are started "
            "by hpcvm cluster migrate, not by hand"
        ) from exc


def _hold(now: str) -> None:
    """Fault injection for the tests (HOLD_ENV): a window to kill this step in."""
    at, _, seconds = os.environ.get(HOLD_ENV, "").partition(":")
    if at == now and seconds:
        time.sleep(float(seconds))


class SettleRequest(Frozen):
    """What ``cluster migrate`` asks the source node once the source step died without
    its result: how far the move got (``moved`` None), then, from "go" on, having seen
    in the target's events whether the target runs the VM, to settle it."""

    batch: str
    vm: str  # the VM's name on the source node
    target: str
    move: str  # the move's id (MigrateRequest)
    moved: bool | None = None  # the target runs the VM, or listens again; None: ask


def run_settle(request_json: str) -> int:
    """The one task of a settle step on the source node (cluster/tasks/moved.py): the phase
    the dead step's marker reached, or the paused copy here marked moved (the node's
    task then takes it down, as after any move) or resumed, since the target does not
    run it; the result line says which."""
    request = _request(SettleRequest, request_json)
    node = get_batch(request.batch).this_node(os.environ)

    def act() -> NodeResult:
        with interrupting(signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            return NodeResult(node=node, ok=True, message=_settle(request))

    return report(node, act)


def _settle(request: SettleRequest) -> str:
    """The phase (asked), or what was done. A VM that runs here although the target
    reported it ready is refused, not stopped: one of the two copies must go, and only
    a person can tell which one's guest went on (both ran since)."""
    from hpcvm.runtime.backends.registry import get_backend
    from hpcvm.runtime.machine import state as vm_state

    if request.moved is None:
        return _phase_reached(request.vm, request.move)
    machine = vm_state.load_machine(request.vm)
    running = get_backend(machine.backend, machine.connect_uri).status(machine) == "running"
    if not request.moved:
        line = "it runs here" if running else resume_or_stop(machine)
    elif running:
        raise RuntimeFailure(
            f"VM {machine.name} runs here although the target reported it ready: stop the "
            f"copy whose guest should not go on (hpcvm down {machine.name} here)"
        )
    else:
        _mark_moved(machine, request.target)
        line = "its paused copy here is marked moved: the node's task takes it down"
    clear_moving(machine.name)
    settled_path(machine.name).unlink(missing_ok=True)
    return line


def _phase_reached(vm: str, move: str) -> str:
    """The phase in move ``move``'s marker (still there, or settled by the node's task
    already); "" when it left none (it died before it began)."""
    for path in (moving_path(vm), settled_path(vm)):
        found = read_moving(vm, path)
        if found is not None and found.move == move:
            return found.phase
    return ""


def _mark_moved(machine: Machine, target: str) -> None:
    """The marker, whole or not at all: a half-written one must not make the node's
    task stop a VM that runs here."""
    path = marker_path(machine.name)
    partial = path.with_name(f".{MARKER}.partial")
    try:
        partial.write_text(target + "\n")
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise RuntimeFailure(
            f"VM {machine.name} runs on the target, but its paused copy here could not be "
            f"marked moved ({exc}): stop it with hpcvm down {machine.name}"
        ) from exc


def _connect(target: str, secret: str) -> socket.socket:
    """A connection to the spare node's task, authenticated."""
    host, _, port = target.rpartition(":")
    try:
        conn = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        raise ChannelError(f"cannot reach the spare node at {target}: {exc}") from exc
    try:
        connect_peer(conn, secret)
    except BaseException:
        conn.close()
        raise
    return conn
