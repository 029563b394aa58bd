"""``cluster migrate``: move one node's VM to a spare node of the job while it runs.

The job keeps spare nodes when it starts (``cluster up --spare K``): tasks of the holder
step that run no VM and listen for one (cluster/tasks/migrate_node.py). Migrating is one step
on the VM's node that sends the VM, over a connection both nodes authenticate with the
job's secret, to the spare's task, which re-plans it for its own node (pins, memory
binding and huge pages of that node, the same guest ABI) and holds it from then on.
The guest keeps its MAC and address, so its peers' TCP connections (the MPI job's)
carry on after the downtime; QEMU announces the guest's new place on the segment.

The first VM is not moved: it is the job's MPI launcher, reached on the batch node by
``cluster exec`` and ``wait``. The record learns the new node of the VM, and the old
node becomes a spare.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.batch.spawn import internal_argv
from hpcvm.cluster.commands import control
from hpcvm.cluster.commands.checkpoint import run_step, tail
from hpcvm.cluster.job import state
from hpcvm.cluster.job.spec import NodeEvent, spare_nodes
from hpcvm.cluster.job.state import ClusterRecord
from hpcvm.cluster.tasks.checkpoint_node import NodeResult, parse_results
from hpcvm.cluster.tasks.migrate_node import SECRET_ENV, MigrateRequest, SettleRequest
from hpcvm.errors import HpcvmError, NodeLost, RuntimeFailure, UsageError
from hpcvm.runtime.checkpoint.qemu_state import MIGRATE_TIMEOUT
from hpcvm.runtime.migration.move import RUN_TIMEOUT, SETUP_TIMEOUT, UNKNOWN_PREFIX
from hpcvm.signals import signals_deferred

STEP_NAME = "hpcvm-migrate"
ARRIVE_TIMEOUT = 120.0  # seconds for the target's ready after the source's success
# seconds for the source step: QEMU's migration, the target's setup and run, and slack
STEP_TIMEOUT = MIGRATE_TIMEOUT + SETUP_TIMEOUT + RUN_TIMEOUT + 300.0
LEAVE_TIMEOUT = 30.0  # seconds for the old node to report the VM gone from it
SETTLE_TIMEOUT = 120.0  # seconds for the step that settles a move whose source step died
# seconds a failed move looks whether the job's step ended with it (a dead target's task
# ends the step: srun --kill-on-bad-exit), before it says the VM runs on at its source
END_WAIT = 5.0

Say = Callable[[str], None]


@dataclass(frozen=True)
class Migrated:
    vm: str  # its name on the source node
    source: str
    target: str
    arrived: NodeEvent  # the target's ready event (the VM's new name, pins)
    sent: NodeResult  # the source's result: downtime_ms, total_ms, bytes moved

    def stood_still(self) -> str:
        """How long the guest stood still, or why that was not measured (a move settled
        after its source step died)."""
        sent = self.sent
        if sent.downtime_ms is None:
            return f"{sent.message}; its stand-still was not measured"
        return f"the guest stood still {sent.downtime_ms + (sent.disk_ms or 0.0):.0f} ms"


def migrate(name: str, node: str, to: str, say: Say, *, keeper: bool = False) -> Migrated:
    """Move cluster ``name``'s VM on ``node`` to the spare node ``to``; refused before
    anything moves when either is not what it must be. On failure the VM runs on at
    ``node``. ``keeper``: the job's keeper moves it off a drained node."""
    with state.one_writer(name, keeper=keeper):
        record, latest, alive = control.status(name)
        if not alive:
            raise RuntimeFailure(f"cluster {name} is not up (see hpcvm cluster ps {name})")
        source = _source(record, latest, node)
        listening = _target(record, to)
        spec = state.read_spec(name)
        if spec is None or not spec.migration_secret:
            raise UsageError(
                f"cluster {name} was started by an older hpcvm (no migration secret): "
                "take it down and start it again with --spare"
            )
        request = MigrateRequest(
            batch=record.batch,
            vm=source.vm,
            index=source.index,
            target=listening,
            move=secrets.token_hex(8),
        )
        say(f"{name}: migrating {source.vm} from {node} to {to}")
        with signals_deferred():  # a Ctrl-C waits: the move ends one way or the other
            try:
                sent = _send(record, node, to, request, spec.migration_secret)
            except RuntimeFailure as exc:
                raise _with_job_end(name, exc) from exc.__cause__
            moved = tuple(to if n == node else n for n in record.nodes)
            spare = tuple(node if n == to else n for n in record.spare)
            state.write_record(record.model_copy(update={"nodes": moved, "spare": spare}))
        arrived = _arrived(record, source.index, to)
        _left(record, node)
        return Migrated(source.vm, node, to, arrived, sent)


def _source(record: ClusterRecord, latest: list[NodeEvent], node: str) -> NodeEvent:
    found = [e for e in latest if e.node == node and e.event == "ready"]
    if not found:
        runs = ", ".join(f"{e.node} ({e.vm})" for e in latest if e.event == "ready")
        raise UsageError(
            f"node {node} runs no VM of cluster {record.name}: its VMs run on {runs or 'none'}"
        )
    if found[0].index == 0:
        raise UsageError(
            f"{found[0].vm} on {node} is the job's first VM, which runs mpirun and is "
            "reached from the batch script on this node: migrate another node's VM"
        )
    return found[0]


def _target(record: ClusterRecord, to: str) -> str:
    """Where the spare node ``to`` listens."""
    if to not in record.spare:
        spares = ", ".join(record.spare) or "none (cluster up --spare K keeps the last K)"
        raise UsageError(
            f"node {to} is not a spare node of cluster {record.name}: its spare nodes are {spares}"
        )
    listening = spare_nodes(state.events(record.name)).get(to)
    if listening is None or not listening.address:
        raise RuntimeFailure(
            f"the spare node {to} of cluster {record.name} is not listening for a VM "
            f"(see hpcvm cluster ps {record.name} and its log)"
        )
    return listening.address


def _send(
    record: ClusterRecord, node: str, to: str, request: MigrateRequest, secret: str
) -> NodeResult:
    """The source step on ``node``: its one result, or RuntimeFailure with why. A step
    that died without one is settled from the target's events (``_unanswered``)."""
    seen = len(state.events(record.name))
    env = {**os.environ, SECRET_ENV: secret}
    try:
        results, why = _node_step(
            record, node, "migrate-source", request.model_dump_json(), "migrate",
            env=env, timeout=STEP_TIMEOUT,
        )  # fmt: skip
    except ValueError as exc:
        raise RuntimeFailure(f"the migrate step answered garbled lines ({exc})") from None
    if not results:
        return _unanswered(record, node, to, request, seen, why)
    if not results[0].ok:
        where = (
            "it stays paused there: see hpcvm cluster ps and the target's log"
            if results[0].message.startswith(UNKNOWN_PREFIX)
            else f"it runs on at {node}"
        )
        raise RuntimeFailure(
            f"migrating {request.vm} from {node} failed: {results[0].message}; {where}"
        )
    return results[0]


def _unanswered(
    record: ClusterRecord, node: str, to: str, request: MigrateRequest, seen: int, why: str
) -> NodeResult:
    """The source step died without its result (killed outright). A settle step on
    ``node`` first tells how far its marker got. Before "go" the node's task resumes
    the VM by itself. From "go" on only the target knows whether it runs the VM, and
    says so in its events (cluster/tasks/moved.py): ready for the VM's index (the paused copy
    at ``node`` is then marked moved and goes, and the move stands), or spare again
    after this move (the copy is resumed). The result is this move's, with ``message``
    saying what happened."""
    vm = request.vm
    ask = SettleRequest(batch=record.batch, vm=vm, target=request.target, move=request.move)
    ok, phase = _settle(record, node, ask)
    if not ok:
        raise RuntimeFailure(
            f"migrating {vm} failed: {node} gave no answer ({why}), and how far it got "
            f"could not be asked there ({phase}); see hpcvm cluster ps {record.name}"
        )
    if phase not in ("go", "told"):
        raise RuntimeFailure(
            f"migrating {vm} from {node} failed: its source step died ({why}) before it "
            f"told {to} to run the VM ({phase or 'before it began'}); {node}'s task resumes "
            f"it there if it stood still, and says so in the holder log (hpcvm cluster ps "
            f"{record.name})"
        )
    ran = _target_ran(record, to, request, seen)
    if ran is None:
        raise RuntimeFailure(
            f"migrating {vm} failed: its source step died ({why}) after it told {to} to run "
            f"the VM, and {to} said neither that it runs it nor that it gave it up (the job "
            f"ended, or {RUN_TIMEOUT:g} s passed); it stays paused at {node}"
        )
    ok, settled = _settle(record, node, ask.model_copy(update={"moved": ran}))
    if not ran:
        if not ok:
            settled = f"it could not be resumed there ({settled}): see hpcvm cluster ps"
        raise RuntimeFailure(
            f"migrating {vm} from {node} failed: its source step died ({why}) and {to} does "
            f"not run the VM; at {node}: {settled}"
        )
    if not ok:
        settled = f"its paused copy could not be taken down ({settled}): hpcvm down {vm} there"
    return NodeResult(
        node=node,
        ok=True,
        message=f"its source step died ({why}) after {to} was told to run the VM; at "
        f"{node}: {settled}",
    )


def _target_ran(record: ClusterRecord, to: str, request: MigrateRequest, seen: int) -> bool | None:
    """Whether ``to`` reported the VM ready (True) or listens again after this move
    (False: its spare event names the move) in the events after the first ``seen``;
    None when the job's holder ended first."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        for event in state.events(record.name)[seen:]:
            if event.node != to:
                continue
            if event.event == "ready" and event.index == request.index:
                return True
            if event.event == "spare" and event.move == request.move:
                return False
        if not state.holder_alive(record):
            return None
        time.sleep(control.POLL)
    return None


def _node_step(
    record: ClusterRecord,
    node: str,
    role: str,
    payload: str,
    action: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float,
) -> tuple[list[NodeResult], str]:
    """A one-task step of ``role`` on ``node``: its result lines (ValueError when
    garbled), and the step's exit and last words, for when it gave none."""
    batch = get_batch(record.batch)
    argv = batch.step_argv(
        control.allocation_of(record, (node,)), STEP_NAME, [*internal_argv(role), payload]
    )
    stdout, stderr, code = run_step(
        batch, record, argv, action, name=STEP_NAME, env=env, timeout=timeout
    )
    return parse_results(stdout), f"step exit {code}: {tail(stderr)}"


def _settle(record: ClusterRecord, node: str, request: SettleRequest) -> tuple[bool, str]:
    """The settle step on ``node`` (migrate_node.run_settle): whether it did what was
    asked, and its answer or why not."""
    try:
        results, why = _node_step(
            record, node, "migrate-settle", request.model_dump_json(), "settle the move",
            timeout=SETTLE_TIMEOUT,
        )  # fmt: skip
    except ValueError as exc:
        return False, f"garbled lines ({exc})"
    if not results:
        return False, f"no answer ({why})"
    return results[0].ok, results[0].message


def _with_job_end(name: str, exc: RuntimeFailure) -> RuntimeFailure:
    """``exc``, with what became of the job when its step ended meanwhile (a target
    task that died takes the step with it): a failed move's "it runs on" would be wrong."""
    deadline = time.monotonic() + END_WAIT
    while True:
        try:
            record = state.read_record(name)
        except NodeLost as lost:
            return RuntimeFailure(f"{exc.message}; then the job ended: {lost.message}")
        except HpcvmError:
            return RuntimeFailure(f"{exc.message}; then the job ended (cluster {name} is gone)")
        if not state.holder_alive(record):
            ended = f"its step ended (see hpcvm cluster ps {name})"
            return RuntimeFailure(f"{exc.message}; then the job ended: {ended}")
        if time.monotonic() > deadline:
            return exc
        time.sleep(control.POLL)


def _arrived(record: ClusterRecord, index: int, to: str) -> NodeEvent:
    """The target's ``ready`` for VM ``index``, after its last ``spare``."""
    deadline = time.monotonic() + ARRIVE_TIMEOUT
    while time.monotonic() < deadline:
        events = state.events(record.name)
        spare_at = [i for i, e in enumerate(events) if e.node == to and e.event == "spare"]
        for event in events[spare_at[-1] + 1 if spare_at else 0 :]:
            if event.node == to and event.index == index and event.event == "ready":
                return event
        time.sleep(control.POLL)
    raise RuntimeFailure(
        f"the VM reached {to}, but its task did not report it ready within "
        f"{ARRIVE_TIMEOUT:g} s (see hpcvm cluster ps {record.name} and its log)"
    )


def _left(record: ClusterRecord, node: str) -> None:
    """Wait until the old node's task has stopped the source QEMU and listens as a spare
    (so ``ps`` right after shows it), or LEAVE_TIMEOUT passed."""
    deadline = time.monotonic() + LEAVE_TIMEOUT
    while time.monotonic() < deadline:
        if node in spare_nodes(state.events(record.name)):
            return
        time.sleep(control.POLL)
