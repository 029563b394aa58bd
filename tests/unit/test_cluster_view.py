"""`cluster exec` reads the job's record and its nodes' events without pydantic
(cluster/job/view.py, cluster/commands/first_vm.py), and reads them as the models do:
the models (job/state.py ClusterRecord, job/spec.py NodeEvent, parse_events) are the
oracle for every record and event line below, and a fresh `hpcvm cluster exec` is
checked to import none of them where the files are sound. Its refusals (no cluster,
a job not up, not its first node) are control.py's, word for word."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from hpcvm.cluster.commands import control, first_vm
from hpcvm.cluster.job import spec, state, view
from hpcvm.cluster.job.checkpoint_model import DetachedExec, PeriodicCheckpoints
from hpcvm.errors import HpcvmError, RuntimeFailure
from hpcvm.runtime.hostside import paths

PROBE = """
import json, sys
from hpcvm.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""
MODELS = ("pydantic", "qemu", "asyncio", "rich")


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "rt"))
    return paths.ensure_root()


@pytest.fixture
def holder() -> Iterator[int]:
    """A live process standing in for the job's holder step."""
    with subprocess.Popen(["sleep", "300"]) as proc:
        try:
            yield proc.pid
        finally:
            proc.kill()


def _record(holder_pid: int, **fields: Any) -> state.ClusterRecord:
    values: dict[str, Any] = {
        "name": "job", "batch": "local", "job_id": "7", "nodes": ("local1", "local2"),
        "holder_pid": holder_pid, "network": "10.9.0.0/24", "vcpus": 2,
        "detached": (DetachedExec(pid=12, argv=("mpirun", "./a"), started_at=1.5),),
        "periodic": PeriodicCheckpoints(every=60.0, directory="/ckpt"),
        "on_drain": "migrate", "keeper_pid": 99,
    }  # fmt: skip
    return state.ClusterRecord(**{**values, **fields})


def _up(root: Path, record: state.ClusterRecord, *events: spec.NodeEvent, extra: str = "") -> None:
    state.clusters_dir()
    directory = state.cluster_dir(record.name)
    directory.mkdir(mode=0o700)
    state.write_record(record)
    lines = "".join(f"srun: {e.line()}\n" for e in events)
    (directory / "holder.log").write_text("a task's own output\n" + lines + extra)


def _ready(node: str, index: int) -> spec.NodeEvent:
    return spec.NodeEvent(event="ready", node=node, index=index, vm=f"job-{node}")


def test_the_views_fields_are_the_models() -> None:
    """Checked against the models, so that a field added to one is added here."""
    pairs: list[tuple[dict[str, view.Check], frozenset[str], type[BaseModel]]] = [
        (view.RECORD_FIELDS, view.RECORD_REQUIRED, state.ClusterRecord),
        (view.EVENT_FIELDS, view.EVENT_REQUIRED, spec.NodeEvent),
        (view.DETACHED_FIELDS, frozenset(view.DETACHED_FIELDS), DetachedExec),
    ]
    for fields, required, model in pairs:
        assert set(fields) == set(model.model_fields), model
        assert required == {k for k, f in model.model_fields.items() if f.is_required()}, model
    assert set(view.PERIODIC_FIELDS) == set(PeriodicCheckpoints.model_fields)
    assert get_args(spec.NodeEvent.model_fields["event"].annotation) == get_args(view.EventKind)
    on_drain = state.ClusterRecord.model_fields["on_drain"].annotation
    assert get_args(on_drain) == get_args(view.OnDrain)


Spoil = Callable[[dict[str, Any]], str]

# damage -> whether the model reads the record all the same (pydantic's lax mode)
RECORD_DAMAGES: dict[str, tuple[Spoil, bool]] = {
    "sound": (json.dumps, True),
    "defaults-left-out": (lambda r: json.dumps({k: r[k] for k in view.RECORD_REQUIRED}), True),
    "not-json": (lambda r: "{", False),
    "extra-key": (lambda r: json.dumps({**r, "colour": 1}), False),
    "no-network": (lambda r: json.dumps({k: v for k, v in r.items() if k != "network"}), False),
    "holder-text-digits": (lambda r: json.dumps({**r, "holder_pid": str(r["holder_pid"])}), True),
    "holder-true": (lambda r: json.dumps({**r, "holder_pid": True}), True),
    "holder-list": (lambda r: json.dumps({**r, "holder_pid": [1]}), False),
    "drain-unknown": (lambda r: json.dumps({**r, "on_drain": "pray"}), False),
    "detached-extra": (
        lambda r: json.dumps({**r, "detached": [{**r["detached"][0], "x": 1}]}), False,
    ),
    "periodic-nan": (
        lambda r: json.dumps({**r, "periodic": {**r["periodic"], "every": float("nan")}}), True,
    ),
    "periodic-missing": (
        lambda r: json.dumps({**r, "periodic": {"every": 1.0}}), False,
    ),
}  # fmt: skip


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except (HpcvmError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("damage", list(RECORD_DAMAGES))
def test_the_record_reads_as_the_model_reads_it(root: Path, holder: int, damage: str) -> None:
    _up(root, _record(holder))
    path = state.cluster_dir("job") / state.RECORD_FILE
    spoil, models_read_it = RECORD_DAMAGES[damage]
    path.write_text(spoil(json.loads(path.read_text())))
    vouched = view.record_view(path.read_text()) is not None
    assert vouched == (damage in ("sound", "defaults-left-out"))
    full = _outcome(lambda: state.read_record("job"))
    light = _outcome(lambda: first_vm.read_record("job"))
    if models_read_it:
        assert isinstance(full, state.ClusterRecord)
        assert light == view.RecordView(full.name, full.batch, full.holder_pid, full.network)
    else:
        assert light == full and isinstance(light, str) and "validation error" in light


LINES = [
    "not an event",
    view.EVENT_PREFIX + "{broken",
    view.EVENT_PREFIX + "[1, 2]",
    view.EVENT_PREFIX + json.dumps({"event": "ready", "node": "n1", "index": 0, "vm": "v"}),
    view.EVENT_PREFIX + json.dumps({"event": "ready", "node": "n1", "index": "1", "vm": "v"}),
    view.EVENT_PREFIX + json.dumps({"event": "ready", "node": "n1", "index": 0, "vm": "v", "x": 1}),
    view.EVENT_PREFIX + json.dumps({"event": "exploded", "node": "n1", "index": 0, "vm": "v"}),
    view.EVENT_PREFIX + json.dumps({"event": "down", "node": "n2", "index": True, "vm": "v"}),
    view.EVENT_PREFIX + json.dumps({"event": "died", "node": "n2", "index": 1, "vm": "w",
                                    "vcpu_pus": [0, None], "message": "gone"}),
    "srun: " + _ready("local1", 0).line(),
]  # fmt: skip


def test_event_lines_read_as_the_model_reads_them() -> None:
    light = view.parse_events(LINES, first_vm.by_the_model)
    full = spec.parse_events(LINES)
    assert light == [view.EventView(e.event, e.node, e.index, e.vm) for e in full]
    assert len(light) == 5  # the lax "1" and True indexes read by the model, as before
    assert view.latest_per_node(light) == {
        i: view.EventView(e.event, e.node, e.index, e.vm)
        for i, e in spec.latest_per_node(full).items()
    }


def _refusal(call: Callable[[], object]) -> str:
    with pytest.raises(HpcvmError) as info:
        call()
    return f"{type(info.value).__name__}: {info.value}"


def test_the_refusals_are_controls(
    root: Path, holder: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _refusal(lambda: first_vm.first_vm("nojob")) == _refusal(
        lambda: control.first_vm("nojob")
    )
    _up(root, _record(holder), _ready("local2", 0))
    monkeypatch.delenv("HPCVM_LOCAL_NODE", raising=False)  # this process is on local1
    wrong_node = _refusal(lambda: first_vm.first_vm("job"))
    assert wrong_node == _refusal(lambda: control.first_vm("job")) and "local2" in wrong_node
    monkeypatch.setenv("HPCVM_LOCAL_NODE", "local2")
    record, first = first_vm.first_vm("job")
    assert (record.network, first.vm) == ("10.9.0.0/24", "job-local2")
    full_record, full_first = control.first_vm("job")
    assert (full_first.vm, full_record.network) == (first.vm, record.network)
    gone = _refusal(lambda: first_vm.vm_record("job", first))
    assert gone == _refusal(lambda: control.vm_of("job", full_first))


def test_a_job_whose_holder_died_is_not_up(root: Path) -> None:
    with subprocess.Popen(["true"]) as dead:
        pass
    _up(root, _record(dead.pid), _ready("local1", 0))
    refusal = _refusal(lambda: first_vm.first_vm("job"))
    assert refusal == _refusal(lambda: control.first_vm("job"))
    assert refusal == "RuntimeFailure: cluster job is not up (see hpcvm cluster ps job)"


def test_cluster_exec_reads_the_job_without_the_models(root: Path, holder: int) -> None:
    """Up to the first VM's record, which names no running VM here: the command's own
    refusal, in a fresh process, with none of the models imported on the way."""
    _up(root, _record(holder), _ready("local1", 0), extra="garbled " + view.EVENT_PREFIX + "{\n")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "cluster", "exec", "job", "--", "true"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, paths.ENV_RUNTIME_DIR: str(root), "HPCVM_LOCAL_NODE": "local1"},
    )  # fmt: skip
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["code"] == RuntimeFailure.exit_code
    assert "VM job-local1 of cluster job is gone from this node" in done.stderr
    modules: list[str] = said["modules"]
    assert sorted(m for m in modules if m.split(".")[0] in MODELS) == []
    assert "hpcvm.cluster.job.state" not in modules and "hpcvm.cluster.job.spec" not in modules
