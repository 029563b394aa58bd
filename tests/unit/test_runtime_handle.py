"""The handle `hpcvm exec` reads without pydantic (runtime/machine/handle.py) says what
the full record says, and refuses in ``state.load_machine``'s line what both cannot
read (no record, a bad name, a record not JSON or wrong in a field exec reads): the
record as ``state.save_machine`` writes it, and pydantic's own verdict on a damaged one,
are the oracles."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpcvm.bootspec import BootSpec
from hpcvm.errors import UsageError
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.handle import VmHandle, handle_of, read_handle
from hpcvm.runtime.machine.model import Machine
from tests.runtime_support import tiny_plan


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "rt"))
    return paths.ensure_root()


def _saved(root: Path, name: str) -> Machine:
    run_dir = root / name
    run_dir.mkdir(mode=0o700)
    machine = Machine(
        name=name, backend="qemu", run_dir=str(run_dir), pid=4242, started_at=time.time(),
        plan=tiny_plan(name), image="test", connect_uri=None,
        boot=BootSpec(agent_socket=str(run_dir / "agent.sock"),
                      serial_log=str(run_dir / "console.log")),
    )  # fmt: skip
    state.save_machine(machine)
    return machine


def test_the_handle_says_what_the_record_says(root: Path) -> None:
    machine = _saved(root, "vm1")
    handle = read_handle("vm1")
    assert handle == handle_of(state.load_machine("vm1")) == handle_of(machine)
    assert handle.agent_socket == str(root / "vm1" / "agent.sock")
    assert (handle.pid, handle.backend, handle.serial_log) == (
        4242, "qemu", str(root / "vm1" / "console.log")
    )  # fmt: skip
    assert handle.machine() == machine
    assert handle_of(handle) is handle


def _refusals(name: str) -> tuple[str, str]:
    with pytest.raises(UsageError) as full:
        state.load_machine(name)
    with pytest.raises(UsageError) as light:
        read_handle(name)
    return str(full.value), str(light.value)


def test_no_record_and_a_bad_name_are_refused_as_load_machine_refuses_them(root: Path) -> None:
    full, light = _refusals("nope")
    assert light == full and "no VM named 'nope'" in light and "\n" not in light
    full, light = _refusals("../x")
    assert light == full and light.startswith("invalid VM name")


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: "{not json",
        lambda r: json.dumps([r]),
        lambda r: json.dumps({**r, "pid": "four"}),
        lambda r: json.dumps({k: v for k, v in r.items() if k != "name"}),
        lambda r: json.dumps({**r, "boot": {**r["boot"], "agent_socket": 7}}),
    ],
    ids=["not-json", "not-an-object", "pid-text", "no-name", "socket-number"],
)
def test_a_damaged_record_is_refused_where_pydantic_refuses_it(root: Path, damage) -> None:  # type: ignore[no-untyped-def]
    _saved(root, "vm2")
    record = root / "vm2" / paths.MACHINE_FILE
    record.write_text(damage(json.loads(record.read_text())))
    full, light = _refusals("vm2")
    assert light == full and "no VM named 'vm2'" in light


def test_a_handle_without_a_record_has_no_machine(tmp_path: Path) -> None:
    handle = VmHandle("gone", str(tmp_path), "qemu", None, None, None)
    assert handle.machine() is None
