"""The record `ps` and `down` read without pydantic (runtime/machine/record.py) says
what the full record says, and never vouches for a record the models refuse: each
damaged record below is left to the models (None), whose own verdict (the oracle) the
callers then follow. A name no VM may have and a runtime directory of another user's
are refused by `ps` and `down` in the very words of the reading through the models."""

from __future__ import annotations

import json
import os
import pwd
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpcvm.bootspec import BootSpec, Nic
from hpcvm.errors import UsageError
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import record, state
from hpcvm.runtime.machine.handle import handle_of
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.vm import inventory, stopping
from tests.runtime_support import tiny_plan

NIC = Nic(
    kind="bridge", source="br0", mac="52:54:00:12:34:56", ifname="hv0", mtu=1500,
    address="10.9.0.5/24",
)  # fmt: skip


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "rt"))
    return paths.ensure_root()


def _saved(root: Path, name: str, **fields: Any) -> Machine:
    run_dir = root / name
    run_dir.mkdir(mode=0o700)
    machine = Machine(
        name=name, backend="qemu", run_dir=str(run_dir), pid=4242, started_at=time.time(),
        plan=tiny_plan(name, vcpus=2), image="test", connect_uri=None,
        boot=BootSpec(agent_socket=str(run_dir / "agent.sock"),
                      qmp_socket=str(run_dir / "qmp.sock"),
                      done_socket=str(run_dir / "done.sock"),
                      serial_log=str(run_dir / "console.log"),
                      disk_image="/images/a.qcow2", nics=(NIC,)),
        hugetlbfs_dirs=("/dev/hugepages-hpcvm/x",), **fields,
    )  # fmt: skip
    state.save_machine(machine)
    return machine


def test_the_record_says_what_the_model_says(root: Path) -> None:
    machine = _saved(root, "vm1")
    light = record.read_record(root / "vm1")
    assert light is not None
    assert light == record.record_of(machine) == record.record_of(state.load_machine("vm1"))
    assert (light.pid, light.vcpus, light.memory_bytes, light.profile) == (
        4242, 2, machine.plan.memory_bytes, "naive"
    )  # fmt: skip
    assert light.nics == (json.loads(NIC.model_dump_json()),)
    assert light.addresses == ("10.9.0.5/24",)
    sockets = ("qmp.sock", "agent.sock", "done.sock")
    assert light.sockets == tuple(str(root / "vm1" / s) for s in sockets)
    assert light.hugetlbfs_dirs == ("/dev/hugepages-hpcvm/x",)
    assert light.handle() == handle_of(machine)
    assert state.uptime(light, now=machine.started_at + 7) == 7.0


def test_its_keys_are_the_models(root: Path) -> None:
    """Checked against the model, so that a field added to Machine is added here."""
    fields = Machine.model_fields
    assert set(fields) == record.MACHINE_KEYS
    assert {k for k, f in fields.items() if f.is_required()} == record.REQUIRED_KEYS


Damage = Callable[[dict[str, Any]], str]


def _with(**changes: Any) -> Damage:
    return lambda r: json.dumps({**r, **changes})


def _plan(**changes: Any) -> Damage:
    return lambda r: json.dumps({**r, "plan": {**r["plan"], **changes}})


def _boot(**changes: Any) -> Damage:
    return lambda r: json.dumps({**r, "boot": {**r["boot"], **changes}})


# damage -> whether the models read the record all the same (pydantic's lax mode)
DAMAGES: dict[str, tuple[Damage, bool]] = {
    "not-json": (lambda r: "{not json", False),
    "not-an-object": (lambda r: json.dumps([r]), False),
    "no-name": (lambda r: json.dumps({k: v for k, v in r.items() if k != "name"}), False),
    "extra-key": (_with(colour="blue"), False),
    "name-number": (_with(name=7), False),
    "plan-text": (_with(plan="naive"), False),
    "vcpus-list": (_plan(vcpus=[2]), False),
    "socket-number": (_boot(qmp_socket=7), False),
    "nics-text": (_boot(nics="hv0"), False),
    "nic-address-number": (_boot(nics=[{**NIC.model_dump(), "address": 5}]), False),
    "hugetlbfs-text": (_with(hugetlbfs_dirs="/dev/x"), False),
    "started-at-null": (_with(started_at=None), False),
    "pid-text-digits": (_with(pid="4242"), True),
    "pid-true": (_with(pid=True), True),
    "started-at-text": (_with(started_at="5"), True),
    "vcpus-text": (_plan(vcpus="2"), True),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_record_it_cannot_vouch_for_is_left_to_the_models(root: Path, damage: str) -> None:
    _saved(root, "vm2")
    path = root / "vm2" / paths.MACHINE_FILE
    spoil, models_read_it = DAMAGES[damage]
    path.write_text(spoil(json.loads(path.read_text())))
    assert record.read_record(root / "vm2") is None
    assert (state.read_machine(root / "vm2") is not None) == models_read_it


def test_a_missing_record_is_none(root: Path) -> None:
    (root / "half").mkdir()
    assert record.read_record(root / "half") is None
    assert record.read_record(root / "nothing-here") is None


def _refusal(call: Callable[[], object]) -> str:
    with pytest.raises(UsageError) as info:
        call()
    return str(info.value)


def test_down_refuses_a_bad_name_and_no_vm_as_before(root: Path) -> None:
    assert _refusal(lambda: stopping.down("../x")) == _refusal(lambda: paths.run_dir("../x"))
    assert _refusal(lambda: stopping.down("nope")) == "no VM named 'nope'; `hpcvm ps` lists them"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown: needs root")
def test_another_users_runtime_dir_is_refused_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(theirs))
    before = _refusal(state.list_entries)  # what ps and down read through the models
    assert "belongs to user nobody" in before
    assert _refusal(inventory.list_vms) == before
    assert _refusal(inventory.running_vms) == before
    assert _refusal(lambda: stopping.down("vm1")) == before
