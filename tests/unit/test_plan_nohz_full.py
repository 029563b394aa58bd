"""`plan --profile hpc` recommends `nohz_full` only where the host's kernel can use it:
a kernel built without CONFIG_NO_HZ_FULL has no /sys/devices/system/cpu/nohz_full, and
`tune --check` reports the setting absent there. Plan and tune must agree.

Oracles: the kernel's own file on this machine, and `hpcvm tune --check` (a separate
reader of the same kernel) for the plan's own pins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvm.host import discover
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest
from hpcvm.units import GIB
from tests.conftest import sysfs_root
from tests.plan_checks import roomy

NOHZ = Path("/sys/devices/system/cpu/nohz_full")


def _host_line(lines: tuple[str, ...] | list[str]) -> str:
    return next(ln for ln in lines if ln.startswith("host kernel command line: isolcpus"))


def hpcvm(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HPCVM_TUNE_DIR": str(state)},
        check=False,
    )


def test_the_live_host_records_what_its_kernel_has() -> None:
    assert discover().nohz_full is NOHZ.exists()


@pytest.mark.parametrize("has", [True, False, None])
def test_recommended_only_where_the_kernel_has_it(snapshots_dir: Path, has: bool | None) -> None:
    host = roomy(discover(sysfs_root=sysfs_root(snapshots_dir, "40intel64-2g2n4c+pci")))
    host = host.model_copy(update={"nohz_full": has})
    vm = plan(host, PlanRequest(profile="hpc", vcpus=4, memory_bytes=2 * GIB))
    line = _host_line(vm.host_tuning)
    cpus = line.split("rcu_nocbs=")[1].split()[0]
    if has is False:
        assert "nohz_full" not in line
        assert any("CONFIG_NO_HZ_FULL" in d.text for d in vm.decisions)
    else:
        assert f"nohz_full={cpus}" in line
    if has is None:
        assert "CONFIG_NO_HZ_FULL" in line  # the description cannot say: the line does


def test_plan_and_tune_check_agree_on_this_host(tmp_path: Path) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("an hpc plan needs a vCPU PU and a housekeeping PU")
    done = hpcvm(
        "plan", "--profile", "hpc", "--vcpus", "1", "--memory", "64M", "--page-size", "4K",
        "--format", "json", state=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    vm = json.loads(done.stdout)
    vcpus = ",".join(str(p["host_pu"]) for p in vm["placements"])
    house = ",".join(map(str, vm["housekeeping_pus"]))
    check = hpcvm(
        "tune", "--check", "--json", "--vcpu-pus", vcpus, "--housekeeping-pus", house,
        state=tmp_path,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    row = next(r for r in json.loads(check.stdout) if r["name"] == "nohz_full")
    recommended = "nohz_full=" in _host_line(vm["host_tuning"])
    assert recommended == (row["ok"] is not None)  # absent in tune <=> left out of plan
