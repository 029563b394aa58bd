"""What ``cluster migrate`` decides without moving a VM: the authenticated connection
its two nodes meet on (runtime/migration/channel.py, over a real socket pair), whose
word counts for a VM that moved (spec.py ``latest_per_node``, ``spare_nodes``), the
spare nodes of an allocation, and the refusals before anything moves, each one line and
non-zero. A real migration between two nodes of the Slurm test cluster, with an MPI
job running across it, is in tests/integration/test_cluster_migrate.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcvm.cluster.batch.base import Allocation
from hpcvm.cluster.commands import control, migrate
from hpcvm.cluster.job import state
from hpcvm.cluster.job.spec import NodeEvent, latest_per_node, spare_nodes
from hpcvm.cluster.job.state import ClusterRecord
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.runtime.migration import channel

SECRET = channel.new_secret()


def _handshake(server_secret: str, client_secret: str) -> tuple[BaseException | None, ...]:
    """Both halves of the handshake over a real socket pair; each side's error."""
    left, right = socket.socketpair()
    errors: list[BaseException | None] = [None, None]

    def serve() -> None:
        try:
            channel.accept_peer(left, server_secret)
        except BaseException as exc:
            errors[0] = exc
        finally:
            left.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        channel.connect_peer(right, client_secret)
    except BaseException as exc:
        errors[1] = exc
    finally:
        right.close()
    thread.join(10)
    return tuple(errors)


def test_both_sides_that_know_the_secret_meet() -> None:
    assert _handshake(SECRET, SECRET) == (None, None)


def test_a_peer_without_the_secret_is_dropped_and_learns_nothing() -> None:
    server, client = _handshake(SECRET, channel.new_secret())
    assert isinstance(server, channel.ChannelError)
    assert "did not prove" in str(server)
    assert isinstance(client, channel.ChannelError)  # the server hung up on it


def test_messages_arrive_whole_and_leave_what_follows_unread() -> None:
    left, right = socket.socketpair()
    with left, right:
        channel.send_message(left, {"index": 3}, b"seed bytes")
        left.sendall(b"QEVM")  # QEMU's stream follows the offer on the same socket
        header, blob = channel.recv_message(right)
        assert header == {"index": 3} and blob == b"seed bytes"
        assert right.recv(4) == b"QEVM"


def test_an_oversized_message_is_refused_before_it_is_read() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall((channel.MAX_MESSAGE + 1).to_bytes(8, "big"))
        with pytest.raises(channel.ChannelError, match="announced"):
            channel.recv_message(right)


def _event(kind: str, node: str, index: int, vm: str = "", address: str = "") -> NodeEvent:
    return NodeEvent.model_validate(
        {"event": kind, "node": node, "index": index, "vm": vm, "address": address or None}
    )


def test_a_moved_vm_is_its_new_nodes_and_its_old_node_a_spare() -> None:
    events = [
        _event("ready", "n1", 0, "j-n1"),
        _event("ready", "n2", 1, "j-n2"),
        _event("spare", "n3", 2, address="10.0.0.3:4000"),
        _event("ready", "n3", 1, "j-n3"),  # the VM arrived
        _event("migrated", "n2", 1, "j-n2"),  # the old node's word after it
        _event("spare", "n2", 1, address="10.0.0.2:4001"),
        _event("died", "n2", 1, "j-n2"),  # an old node cannot speak for the VM any more
    ]
    latest = latest_per_node(events)
    assert {i: (e.node, e.event) for i, e in latest.items()} == {
        0: ("n1", "ready"),
        1: ("n3", "ready"),
    }
    assert set(spare_nodes(events[:-1])) == {"n2"}
    assert spare_nodes(events[:3])["n3"].address == "10.0.0.3:4000"


def test_spare_nodes_are_the_allocations_last() -> None:
    allocation = Allocation(batch="slurm", job_id="9", nodes=("a", "b", "c"))
    assert control._vm_nodes(allocation, 1) == ("a", "b")
    assert control._vm_nodes(allocation, 0) == ("a", "b", "c")
    with pytest.raises(UsageError, match="--spare 3 leaves none"):
        control._vm_nodes(allocation, 3)


def _record() -> ClusterRecord:
    return ClusterRecord(
        name="j", job_id="9", nodes=("n1", "n2"), spare=("n3",), holder_pid=1, network="", vcpus=1
    )


def test_migrate_refuses_the_first_vm_and_a_node_without_one() -> None:
    latest = [_event("ready", "n1", 0, "j-n1"), _event("ready", "n2", 1, "j-n2")]
    with pytest.raises(UsageError, match="first VM, which runs mpirun"):
        migrate._source(_record(), latest, "n1")
    with pytest.raises(UsageError, match=r"node n3 runs no VM .* n1 \(j-n1\), n2 \(j-n2\)"):
        migrate._source(_record(), latest, "n3")
    assert migrate._source(_record(), latest, "n2").vm == "j-n2"


def test_migrate_refuses_a_target_that_is_no_listening_spare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCVM_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(UsageError, match=r"n2 is not a spare node of cluster j: .* n3"):
        migrate._target(_record(), "n2")
    state.cluster_dir("j").mkdir(parents=True)
    with pytest.raises(RuntimeFailure, match="spare node n3 of cluster j is not listening"):
        migrate._target(_record(), "n3")


def test_migrating_in_an_unknown_cluster_is_one_line_and_non_zero(tmp_path: Path) -> None:
    env = {**os.environ, "HPCVM_RUNTIME_DIR": str(tmp_path / "rt")}
    argv = ["cluster", "migrate", "ghost", "--node", "a", "--to", "b"]
    done = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", *argv],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcvm: error:"), done.stderr
    assert not (tmp_path / "rt" / "clusters" / "ghost").exists()


def test_an_empty_secret_proves_nothing() -> None:
    server, client = _handshake("", "")
    assert isinstance(server, channel.ChannelError) and "no migration secret" in str(server)
    assert isinstance(client, channel.ChannelError)


def test_a_peer_that_trickles_bytes_is_dropped_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(channel, "HANDSHAKE_TIMEOUT", 0.5)
    left, right = socket.socketpair()
    with left, right:
        errors: list[BaseException] = []

        def serve() -> None:
            try:
                channel.accept_peer(left, SECRET)
            except channel.ChannelError as exc:
                errors.append(exc)

        thread = threading.Thread(target=serve)
        thread.start()
        right.recv(channel.NONCE_BYTES)
        for _ in range(4):  # a byte now and then, each within a per-read timeout
            right.sendall(b"x")
            thread.join(0.2)
        thread.join(5)
        assert errors and "took too long" in str(errors[0])


def test_a_file_arrives_in_place_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "overlay"
    source.write_bytes(os.urandom(3 * channel.CHUNK + 17))
    target = tmp_path / "target"
    target.write_bytes(b"old contents, longer than nothing")
    inode = target.stat().st_ino
    left, right = socket.socketpair()
    with left, right:
        sender = threading.Thread(target=channel.send_file, args=(left, str(source)))
        sender.start()
        assert channel.recv_file(right, str(target)) == source.stat().st_size
        sender.join(10)
    assert target.read_bytes() == source.read_bytes()
    assert target.stat().st_ino == inode  # rewritten in place: QEMU's open file sees it
    left, right = socket.socketpair()
    with left, right:
        channel.send_message(left, {"size": 4})
        left.sendall(b"abcd")
        channel.send_message(left, {"sha256": "0" * 64})
        with pytest.raises(channel.ChannelError, match="damaged"):
            channel.recv_file(right, str(target))


def test_a_spare_waiting_for_the_disk_gives_up_once_the_source_went() -> None:
    """The target waits for the source's disk connection; a source killed after QEMU's
    pass closes its first connection: the wait ends at once (it took the keeper's next
    move from that node for the dead one's disk), while a live source's disk connection
    is still taken. Real sockets on loopback."""
    from hpcvm.cluster.tasks.migrate_node import Listener
    from hpcvm.runtime.migration.channel import ChannelError

    listener = Listener("127.0.0.1")
    try:
        first, source_end = socket.socketpair()
        host, port = listener.address.split(":")

        def disk() -> None:
            with socket.create_connection((host, int(port))) as conn:
                channel.connect_peer(conn, SECRET)
                conn.recv(1)  # held open until the target is done with it

        sender = threading.Thread(target=disk, daemon=True)
        sender.start()
        taken = listener.accept_peer(SECRET, "127.0.0.1", first)  # the source is alive
        taken.close()
        sender.join(timeout=10)
        source_end.close()  # the source's step dies: its first connection closes
        began = time.monotonic()
        with pytest.raises(ChannelError, match="went before it sent the disk"):
            listener.accept_peer(SECRET, "127.0.0.1", first)
        assert time.monotonic() - began < 5.0  # not CONNECT_TIMEOUT (30 s)
        first.close()
    finally:
        listener.close()


# -- a move whose source step died without its result (migrate._unanswered) -------------


def _log(name: str, *events: NodeEvent) -> None:
    directory = state.cluster_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    with state.log_path(name).open("a") as log:
        log.writelines(e.line() + "\n" for e in events)


def _live_record() -> ClusterRecord:
    return _record().model_copy(update={"holder_pid": os.getpid()})


def _request(move: str = "m1") -> migrate.MigrateRequest:
    return migrate.MigrateRequest(batch="slurm", vm="j-n2", index=1, target="a:1", move=move)


def test_the_targets_events_say_whether_it_ran_a_vm_whose_source_step_died(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the target's events after the move began count: its ready for the VM's
    index (it runs it), or a spare again naming this move (it tore its copy down: a
    spare event of an earlier move, late in the log, is not this one's word); a dead
    holder ends the wait with no answer."""
    monkeypatch.setenv("HPCVM_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(control, "POLL", 0.01)
    _log("j", _event("ready", "n1", 0, "j-n1"), _event("spare", "n3", 2, address="a:1"))
    seen = len(state.events("j"))
    _log("j", _event("ready", "n3", 0, "j-n3"), _event("spare", "n2", 2, address="b:1"))
    _log("j", _spare_after("n3", "m0"), _event("ready", "n3", 1, "j-n3"))
    assert migrate._target_ran(_live_record(), "n3", _request(), seen) is True
    _log("k", _event("spare", "n3", 2, address="a:1"))  # before the move: not a word
    seen = len(state.events("k"))
    _log("k", _spare_after("n3", "m0"), _spare_after("n3", "m1"))
    other = _live_record().model_copy(update={"name": "k"})
    assert migrate._target_ran(other, "n3", _request(), seen) is False
    dead = _record().model_copy(update={"name": "k", "holder_pid": _gone_pid()})
    assert migrate._target_ran(dead, "n3", _request("m2"), seen) is None


def _spare_after(node: str, move: str) -> NodeEvent:
    return _event("spare", node, 2, address="a:1").model_copy(update={"move": move})


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_failed_move_says_the_job_ended_when_its_step_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target task that died ends the job's step (srun --kill-on-bad-exit): the
    failed move must not say the VM runs on at its source then; while the job's holder
    runs, the failure is said as it was."""
    monkeypatch.setenv("HPCVM_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(migrate, "END_WAIT", 0.05)
    monkeypatch.setattr(control, "POLL", 0.01)
    failed = RuntimeFailure("migrating j-n2 from n2 failed: reset; it runs on at n2")
    directory = state.cluster_dir("j")
    directory.mkdir(parents=True)
    (directory / "cluster.json").write_text(_live_record().model_dump_json())
    assert migrate._with_job_end("j", failed) is failed
    (directory / "cluster.json").write_text(
        _record().model_copy(update={"holder_pid": _gone_pid()}).model_dump_json()
    )
    said = migrate._with_job_end("j", failed).message
    assert said.startswith(failed.message) and "then the job ended: its step ended" in said
    (directory / "cluster.json").unlink()
    state.ended_path(directory).write_text(
        "its step ended with exit 9 (srun: error: n3: task 2: Killed)\n"
    )
    said = migrate._with_job_end("j", failed).message
    assert "then the job ended: cluster j ended while its job ran" in said, said
    assert "n3: task 2: Killed" in said


def test_a_hold_is_taken_only_at_its_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcvm.cluster.tasks import migrate_node

    slept: list[float] = []
    monkeypatch.setattr(migrate_node.time, "sleep", slept.append)
    monkeypatch.setenv(migrate_node.HOLD_ENV, "told:7.5")
    for phase in ("sending", "paused", "go", "told"):
        migrate_node._hold(phase)
    assert slept == [7.5]


@pytest.mark.parametrize("role", ["migrate-source", "migrate-settle"])
def test_a_hand_made_step_request_is_refused_in_one_line(role: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hpcvm.cluster.internal", role, '{"bad": 1}'],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "started by hpcvm cluster migrate" in lines[0], done.stderr
