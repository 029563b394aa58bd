"""``hpcvm checkpoint`` refuses the built-in guest, says why and what to do instead, and
leaves the VM exactly as it was: running (not paused), its files in place, and no
checkpoint directory, not even a partial one.

Why it is refused is QEMU's own answer (QMP ``query-migrate``'s blocked reasons: the
guest has its 9p root mounted), so the test also asks QEMU directly, as an oracle that
is not hpcvm's message. docs/checkpoint.md says why the built-in guest is not made
checkpointable another way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.runtime.channels import qmp
from hpcvm.runtime.machine import state
from tests.runtime_support import hpcvm, isolated_runtime, one_line_error

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with isolated_runtime(tmp_path, monkeypatch, lambda: hpcvm("down", "--all")) as root:
        yield root


def test_the_builtin_guest_is_refused_with_the_reason_and_left_running(
    runtime: Path, tmp_path: Path
) -> None:
    up = hpcvm("up", "--name", "b", "--profile", "naive", "--vcpus", "1", "--memory", "256M")
    assert up.returncode == 0, up.stderr
    machine = state.load_machine("b")
    assert machine.boot.qmp_socket is not None
    blocked = qmp.execute(machine.boot.qmp_socket, "query-migrate")["blocked-reasons"]
    assert any("VirtFS" in reason for reason in blocked), blocked  # QEMU's own word

    target = tmp_path / "ckpt" / "b"
    target.parent.mkdir()
    done = hpcvm("checkpoint", "b", str(target))
    line = one_line_error(done)
    assert done.returncode == 2, done.stderr
    assert "cannot be checkpointed" in line and "VirtFS" in line and "--image" in line, line

    assert list(target.parent.iterdir()) == []  # no directory, no partial one
    status = qmp.execute(machine.boot.qmp_socket, "query-status")
    assert status["running"] is True  # never paused
    rows = json.loads(hpcvm("ps", "--json").stdout)
    assert [(r["name"], r["state"]) for r in rows] == [("b", "running")]
    assert hpcvm("exec", "b", "--", "true").returncode == 0
