"""A cluster job's record and its nodes' events as ``cluster exec`` reads them, without
pydantic: a batch script runs ``cluster exec`` for every program of its job, and the
models of job/state.py and job/spec.py (with the VM request's and the planner's under
them) cost it more than reading the two files (docs/performance.md, issue 37).

``record_view`` and ``parse_events`` take what the models take, field by field with
the JSON types they accept (a bool is no int, a number is finite), and hand whatever
they cannot vouch for to the models (commands/first_vm.py: the models import this
module, so it cannot import them), which then decide as before: a record the models
refuse is refused by them in the same words, an event line they refuse is skipped as
it was. Only such input loads the models. ``latest_per_node`` (each VM's last word)
serves the models' events and these alike.

The names the models use for what is read here (the record's file and directory, the
event lines' prefix, the event kinds, ``--on-drain``'s values) are defined here, where
both can import them without pydantic; job/state.py and job/spec.py re-export them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, get_args

from hpcvm.cluster.job.state_files import LOG_FILE, ended_path
from hpcvm.errors import NodeLost, UsageError
from hpcvm.runtime.hostside import paths

CLUSTERS_DIR = ".clusters"  # under the runtime root; dot: `hpcvm ps` skips it
RECORD_FILE = "cluster.json"
EVENT_PREFIX = "hpcvm-cluster-event "
# A spare node's task reports ``spare`` (listening for a migrating VM at ``address``,
# HOST:PORT); a node whose VM moved away reports ``migrated``, then ``spare``
EventKind = Literal["loaded", "ready", "failed", "died", "down", "spare", "migrated"]
# what the keeper does when one of the job's nodes drains (cluster/commands/keeper.py)
OnDrain = Literal["none", "migrate", "checkpoint"]


def cluster_dir(name: str) -> Path:
    return paths.runtime_root() / CLUSTERS_DIR / paths.check_name(name)


def ended_note(name: str) -> str | None:
    """Why cluster ``name``'s step ended on its own, as its holder noted (state_files)."""
    try:
        return ended_path(cluster_dir(name)).read_text().strip() or None
    except OSError:
        return None


def record_path(name: str) -> Path:
    """Cluster ``name``'s record file; NodeLost when its step ended on its own, a
    UsageError when there is no such cluster on this node."""
    path = cluster_dir(name) / RECORD_FILE
    if not path.is_file():
        ended = ended_note(name)
        if ended is not None:
            raise NodeLost(
                f"cluster {name} ended while its job ran: {ended}; its VMs are gone (a "
                f"requeued job restores its newest checkpoint, if it took any)"
            )
        raise UsageError(
            f"no cluster named {name!r} on this node: start it with hpcvm cluster up --name "
            f"{name} (ps, exec and down run where up ran, the job's batch node)"
        )
    return path


# -- the checks: one per JSON type a field of the models takes ---------------------------

Check = Callable[[object], bool]


def _str(value: object) -> bool:
    return isinstance(value, str)


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63


def _float(value: object) -> bool:
    return math.isfinite(value) if isinstance(value, float) else _int(value)


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _list(check: Check) -> Check:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


def _one_of(kind: Any) -> Check:
    choices = get_args(kind)
    return lambda value: isinstance(value, str) and value in choices


def _object(fields: dict[str, Check], required: frozenset[str]) -> Check:
    """A JSON object with ``required`` and no key but those of ``fields`` (the models
    forbid others), each as its check says."""
    return lambda value: (
        isinstance(value, dict)
        and required <= value.keys() <= fields.keys()
        and all(fields[key](v) for key, v in value.items())
    )


# job/checkpoint_model.py DetachedExec and PeriodicCheckpoints, job/state.py ClusterRecord
DETACHED_FIELDS: dict[str, Check] = {"pid": _int, "argv": _list(_str), "started_at": _float}
PERIODIC_FIELDS: dict[str, Check] = {"every": _float, "directory": _str, "keep": _int}
RECORD_FIELDS: dict[str, Check] = {
    "name": _str,
    "batch": _str,
    "job_id": _str,
    "nodes": _list(_str),
    "spare": _list(_str),
    "holder_pid": _int,
    "network": _str,
    "vcpus": _int,
    "detached": _list(_object(DETACHED_FIELDS, frozenset(DETACHED_FIELDS))),
    "periodic": _optional(_object(PERIODIC_FIELDS, frozenset({"every", "directory"}))),
    "on_drain": _one_of(OnDrain),
    "keeper_pid": _optional(_int),
}
RECORD_REQUIRED = frozenset({"name", "job_id", "nodes", "holder_pid", "network", "vcpus"})
# job/spec.py NodeEvent
EVENT_FIELDS: dict[str, Check] = {
    "event": _one_of(EventKind),
    "node": _str,
    "index": _int,
    "vm": _str,
    "step": _optional(_str),
    "address": _optional(_str),
    "vcpu_pus": _list(_optional(_int)),
    "profile": _optional(_str),
    "accel": _optional(_str),
    "message": _str,
    "log": _str,
    "move": _str,
}
EVENT_REQUIRED = frozenset({"event", "node", "index", "vm"})


@dataclass(frozen=True)
class RecordView:
    """What ``cluster exec`` reads of the record (job/state.py ``ClusterRecord``)."""

    name: str
    batch: str
    holder_pid: int
    network: str


@dataclass(frozen=True)
class EventView:
    """What ``cluster exec`` reads of a node's event (job/spec.py ``NodeEvent``)."""

    event: str
    node: str
    index: int
    vm: str


def record_view(text: str) -> RecordView | None:
    """The record in ``text`` (a ``cluster.json``); None when this reader cannot vouch
    for it: the model decides then (commands/first_vm.py)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not _object(RECORD_FIELDS, RECORD_REQUIRED)(data):
        return None
    return RecordView(data["name"], data.get("batch", "slurm"), data["holder_pid"], data["network"])


# What an event line this reader cannot vouch for is, as the model reads it (None: the
# model refuses it): the caller's, which may import the model (commands/first_vm.py).
Judge = Callable[[dict[str, Any]], "EventView | None"]


def events(name: str, judge: Judge) -> list[EventView]:
    """The nodes' events so far, in the order they arrived (job/state.py ``events``)."""
    log = cluster_dir(name) / LOG_FILE
    if not log.is_file():
        return []
    return parse_events(log.read_text(errors="replace").splitlines(), judge)


def parse_events(lines: Iterable[str], judge: Judge) -> list[EventView]:
    """job/spec.py ``parse_events`` (a garbled event line skipped), as ``EventView``."""
    found: list[EventView] = []
    for line in lines:
        _, prefixed, payload = line.partition(EVENT_PREFIX)
        if not prefixed:
            continue
        try:
            data = json.loads(payload)
        except ValueError:
            continue
        if _object(EVENT_FIELDS, EVENT_REQUIRED)(data):
            found.append(EventView(data["event"], data["node"], data["index"], data["vm"]))
        elif isinstance(data, dict) and (judged := judge(data)) is not None:
            found.append(judged)
    return found


class Said(Protocol):
    """What ``latest_per_node`` reads of an event (a ``NodeEvent`` or an ``EventView``)."""

    @property
    def event(self) -> str: ...

    @property
    def node(self) -> str: ...

    @property
    def index(self) -> int: ...


E = TypeVar("E", bound=Said)


def latest_per_node(events: Iterable[E]) -> dict[int, E]:
    """Each VM's last word, by its index in the job. A VM that migrated is the target
    node's from its ``ready`` on: what its old node says after that (``migrated``) and
    what a spare says about itself are not the VM's."""
    out: dict[int, E] = {}
    for event in events:
        if event.event in ("spare", "migrated"):
            continue
        known = out.get(event.index)
        if known is None or known.node == event.node or event.event == "ready":
            out[event.index] = event
    return dict(sorted(out.items()))
