"""Issue 36: ``tune --check`` recommended isolating CPU 0. Why: a pinned VM (or an hpc
one with ``--housekeeping 0``) on a 1-node 2-PU host gets PU 0, and the tuning target
took the vCPU PUs as the PUs to isolate at boot and every other PU as housekeeping, so
it asked for ``isolcpus=managed_irq,domain,0 nohz_full=0 rcu_nocbs=0``. CPU 0 is the
kernel's boot CPU (timekeeping, interrupts that cannot move): it is never isolated,
nor is a housekeeping PU, wherever the target comes from.

Plans from the real planner on every snapshot in ../shared/topologies/ and on this host
(the small vCPU counts that land on CPU 0, the profiles and housekeeping counts that
pin), the real ``hpcvm tune --check --json`` on this host.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvm.errors import HpcvmError
from hpcvm.host import HostTopology, discover
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest, VMPlan
from hpcvm.tune.registry import REGISTRY
from hpcvm.tune.settings.boot import BootParam, boot_advice
from hpcvm.tune.target import from_plan
from hpcvm.tune.tuned import tuned_profile
from hpcvm.units import MIB, parse_cpu_list
from tests.conftest import Snapshot
from tests.plan_checks import roomy

HPCVM = str(Path(sys.executable).with_name("hpcvm"))
ISOLATING = ("isolcpus", "nohz_full", "rcu_nocbs")


def _plans(host: HostTopology) -> list[VMPlan]:
    out = []
    shapes: list[dict[str, object]] = [
        {"profile": "pinned"},
        {"profile": "numa", "page_size_bytes": 4096},
        {"profile": "hpc", "housekeeping": 0, "page_size_bytes": 4096},
        {"profile": "hpc", "page_size_bytes": 4096},
    ]
    for shape in shapes:
        for vcpus in (1, 2):
            fields = {"vcpus": vcpus, "memory_bytes": 256 * MIB, "accel": "tcg", **shape}
            try:
                out.append(plan(host, PlanRequest.model_validate(fields)))
            except HpcvmError:
                continue
    return out


def _isolated_by(text: str) -> set[int]:
    """The CPUs a kernel parameter 'name=[flags,]LIST' names."""
    value = text.partition("=")[2]
    return set(parse_cpu_list(",".join(p for p in value.split(",") if p[:1].isdigit())))


def _check_plan(p: VMPlan, online: frozenset[int]) -> bool:
    """Nothing derived from ``p`` isolates CPU 0 or a housekeeping PU; True when the
    plan put a vCPU on CPU 0 (the case of the issue)."""
    for line in p.host_tuning:
        for word in re.findall(r"(?:isolcpus|nohz_full|rcu_nocbs)=\S+", line):
            assert 0 not in _isolated_by(word), line
            assert not _isolated_by(word) & set(p.housekeeping_pus), line
    try:
        target = from_plan(p, online, "p")
    except HpcvmError:
        return False  # no PU left for the host: refused, nothing recommended
    barred = {0, *target.housekeeping_pus}
    tokens = {name: s.token(target) for name, s in REGISTRY.items() if isinstance(s, BootParam)}
    for name in ISOLATING:
        assert not _isolated_by(tokens[name]) & barred, (tokens[name], target)
    rows = [s.check(target) for s in REGISTRY.values() if isinstance(s, BootParam)]
    for line in boot_advice(rows, tokens):
        for word in re.findall(r"(?:isolcpus|nohz_full|rcu_nocbs)=\S+", line):
            assert not _isolated_by(word) & barred, line
    if target.isolated_pus():
        isolated = re.search(r"isolated_cores=(\S+)", tuned_profile(target))
        assert isolated is not None and not set(parse_cpu_list(isolated[1])) & barred
    # every vCPU PU but CPU 0 is still isolated: the fix drops CPU 0, nothing else
    assert set(target.isolated_pus()) == set(target.vcpu_pus) - {0}
    return 0 in p.vcpu_pus()


def test_no_plan_on_any_snapshot_isolates_cpu_0(snapshot: Snapshot) -> None:
    if snapshot.kind == "sysfs":
        host = roomy(discover(sysfs_root=snapshot.path))
    else:
        host = roomy(discover(xml=snapshot.path))
    online = frozenset(p.os_index for p in host.pus if p.online)
    for p in _plans(host):
        _check_plan(p, online)


def test_this_host_vm_on_cpu_0_is_not_isolated_at_boot() -> None:
    host = discover()
    online = frozenset(p.os_index for p in host.pus if p.online)
    on_zero = [_check_plan(p, online) for p in _plans(host)]
    assert any(on_zero), "no plan here put a vCPU on CPU 0: the issue's case is not tested"


def test_tune_check_for_a_plan_on_cpu_0(tmp_path: Path) -> None:
    """The issue's command on this host: a plan whose vCPU is on CPU 0 (hpc with
    --housekeeping 0), checked with the real CLI."""
    shown = subprocess.run(
        [HPCVM, "plan", "--profile", "hpc", "--housekeeping", "0", "--vcpus", "1",
         "--memory", "256M", "--page-size", "4K", "--accel", "tcg", "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    vcpu_pus = {p["host_pu"] for p in json.loads(shown.stdout)["placements"]}
    if vcpu_pus != {0}:
        pytest.skip(f"the planner put the vCPU on {vcpu_pus} here, not CPU 0")
    path = tmp_path / "plan.json"
    path.write_text(shown.stdout)
    done = subprocess.run(
        [HPCVM, "tune", "--check", "--json", "--plan", str(path), "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    for name in ISOLATING:
        assert "=" not in rows[name]["wanted"] or 0 not in _isolated_by(rows[name]["wanted"])
    text = subprocess.run(
        [HPCVM, "tune", "--check", "--plan", str(path), "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "isolcpus=managed_irq,domain,0" not in text.stdout
    assert "nohz_full=0" not in text.stdout and "rcu_nocbs=0" not in text.stdout
    assert "CPU 0 runs a vCPU but is never isolated at boot" in text.stdout
