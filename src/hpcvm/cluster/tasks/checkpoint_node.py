"""One task of a job checkpoint's step: one phase for the VM on this node.

``cluster checkpoint`` (cluster/commands/checkpoint.py) runs each phase as a step of the batch
system with one task per node, and a phase starts only when the step before it has
ended on every node: so every VM is paused before any is saved (no message between
the guests is half sent), and every VM is saved before any runs again. The VM belongs
to the node's holder task; this task reaches it through its QMP socket, as ``hpcvm
checkpoint`` does on one host (runtime/checkpoint/save_restore.py).

Each task prints one result line and exits 0 even when its phase failed: a failing
exit would make the batch system end the other nodes' tasks in the middle of their
save (``--kill-on-bad-exit``). The client reads every node's line and decides.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.job.checkpoint_model import vm_dir_name
from hpcvm.errors import HpcvmError, UsageError
from hpcvm.model import Frozen

RESULT_PREFIX = "hpcvm-checkpoint-node "

Action = Literal["check", "pause", "save", "resume"]


class NodeVm(Frozen):
    vm: str
    index: int


class Phase(Frozen):
    """What every task of a phase's step is asked: the action, and each node's VM."""

    action: Action
    batch: str
    vms: dict[str, NodeVm]  # node name -> its VM
    directory: str  # check: where the checkpoint goes; save: its hidden sibling


class NodeResult(Frozen):
    node: str
    ok: bool
    message: str = ""
    seconds: float = 0.0
    state_bytes: int = 0
    disk_bytes: int = 0
    downtime_ms: float | None = None  # a live migration's (cluster migrate): QEMU's,
    disk_ms: float | None = None  # then still paused while the disk overlay is copied
    total_ms: float | None = None

    def line(self) -> str:
        return RESULT_PREFIX + self.model_dump_json()


def parse_results(text: str) -> list[NodeResult]:
    """The result lines among a step's output (srun may prefix them)."""
    found = []
    for line in text.splitlines():
        _, hit, payload = line.partition(RESULT_PREFIX)
        if hit:
            found.append(NodeResult.model_validate(json.loads(payload)))
    return found


def run(phase_json: str) -> int:
    """The task: do the phase for this node's VM and print its result line."""
    phase = Phase.model_validate_json(phase_json)
    node = get_batch(phase.batch).this_node(os.environ)
    return report(node, lambda: _act(phase, node))


def report(node: str, act: Callable[[], NodeResult]) -> int:
    """Run a step task's work and print its result line, timed; a failure is this
    node's answer, never an exit code (module doc)."""
    begin = time.monotonic()
    try:
        result = act()
    except KeyboardInterrupt:
        result = NodeResult(node=node, ok=False, message="interrupted")
    except HpcvmError as exc:
        result = NodeResult(node=node, ok=False, message=str(exc))
    except OSError as exc:  # the system's words (a full disk: No space left on device)
        where = f": {exc.filename}" if exc.filename else ""
        result = NodeResult(node=node, ok=False, message=f"{exc.strerror or exc}{where}")
    except Exception as exc:  # any failure is this node's answer, never an exit code
        result = NodeResult(node=node, ok=False, message=f"{type(exc).__name__}: {exc}")
    result = result.model_copy(update={"seconds": round(time.monotonic() - begin, 6)})
    sys.stdout.write(result.line() + "\n")
    sys.stdout.flush()
    return 0


def _act(phase: Phase, node: str) -> NodeResult:
    from hpcvm.runtime.checkpoint import save_restore as checkpoint
    from hpcvm.runtime.machine import state as vm_state

    mine = phase.vms.get(node)
    if mine is None:
        raise UsageError(f"node {node} has no VM of this job")
    machine = vm_state.load_machine(mine.vm)
    directory = Path(phase.directory)
    if phase.action == "check":
        checkpoint.check(machine)
        if not directory.is_dir():
            raise UsageError(
                f"node {node} does not see {directory}: a job checkpoint goes on a file "
                "system every node of the job shares (and the nodes that restore it)"
            )
    elif phase.action == "pause":
        checkpoint.pause(machine)
    elif phase.action == "save":
        saved = checkpoint.save(machine, directory / vm_dir_name(mine.index))
        return NodeResult(
            node=node, ok=True, state_bytes=saved.state_bytes, disk_bytes=saved.disk_bytes
        )
    else:
        checkpoint.resume(machine)
    return NodeResult(node=node, ok=True)
