"""Issue 36: a user's pinned VMs land on different PUs while free ones are left, and the
VM that must share a PU says so; ``hpcvm plan`` shows the very choice ``up`` makes.

Real ``hpcvm up`` of the built-in guest under TCG (1 vCPU, 256M each), one VM per usable
PU (started at once) and then one more; where each vCPU runs is read from the host,
from the affinity of QEMU's vCPU threads in /proc (thread names "CPU n/TCG"), never from
hpcvm's records.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from tests.integration.test_runtime_lifecycle import cpus_allowed, vcpu_tids_by_name
from tests.runtime_support import HPCVM, Residue, assert_nothing_left, hpcvm

pytestmark = pytest.mark.integration

VM = ["--profile", "pinned", "--vcpus", "1", "--memory", "256M", "--accel", "tcg"]


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guest: None) -> Iterator[Path]:
    root = tmp_path / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    monkeypatch.setenv("HPCVM_READY_TIMEOUT", "180")
    before = Residue.take(root)
    yield root
    subprocess.run([HPCVM, "down", "--all", "--timeout", "10"], capture_output=True)
    assert_nothing_left(before)


def vcpu_pus(name: str) -> set[int]:
    """Where VM ``name``'s one vCPU thread may run, as the kernel says."""
    machine = state.load_machine(name)
    assert machine.pid is not None
    (tid,) = vcpu_tids_by_name(machine.pid).values()
    return cpus_allowed(machine.pid, tid)


def test_each_vm_its_own_pu_then_one_shares_and_says_so(runtime: Path) -> None:
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) > 4:
        pytest.skip("boots one VM per usable PU: meant for small CI hosts")
    # started all at once, as a user's job script might: each up plans beside the
    # records the others have written
    names = [f"place{i}" for i in range(len(usable))]
    ups = {
        name: subprocess.Popen(
            [HPCVM, "up", "--name", name, *VM], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for name in names
    }
    held: dict[str, set[int]] = {}
    for name, proc in ups.items():
        _out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
        assert b"shared with" not in err, err.decode()
        held[name] = vcpu_pus(name)
        assert len(held[name]) == 1
    everyone = [pu for pus in held.values() for pu in pus]
    assert sorted(everyone) == usable  # one VM per PU: none pinned onto another's

    # every PU is held now: the plan says which one the next VM shares, and with whom
    shown = hpcvm("plan", *VM, "--format", "json")
    assert shown.returncode == 0, shown.stderr
    planned = {p["host_pu"] for p in json.loads(shown.stdout)["placements"]}
    (pu,) = planned
    owner = next(name for name, pus in held.items() if pu in pus)
    warning = next(w for w in json.loads(shown.stdout)["warnings"] if "shared with" in w)
    assert f"PU {pu} with VM {owner}" in warning

    up = hpcvm("up", "--name", "extra", *VM)
    assert up.returncode == 0, up.stderr
    assert f"vCPU PUs shared with your running VMs: PU {pu} with VM {owner}" in up.stderr
    assert vcpu_pus("extra") == planned  # what `hpcvm plan` showed is what up did
