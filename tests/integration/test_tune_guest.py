"""`hpcvm tune` inside a running built-in guest: a real Linux (Debian's kernel) with its
own /proc/irq, sysctls and command line, where every setting is writable.

One boot runs a script that records every file tuning may touch (the IRQs' hex masks
too, which hpcvm never writes), applies, checks, reverts and compares byte for byte,
then injects a failure midway (a value the kernel rejects) and checks the rollback.
The guest's / is a tmpfs overlay, so the state directory in /run is writable there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvm.runtime.hostside import paths
from hpcvm.tune.cpumask import parse_mask

HPCVM = str(Path(sys.executable).with_name("hpcvm"))
PYTHON = sys.executable

FILES = (
    "/proc/irq/default_smp_affinity /proc/irq/*/smp_affinity /proc/irq/*/smp_affinity_list "
    "/sys/devices/virtual/workqueue/cpumask /proc/sys/kernel/watchdog_cpumask "
    "/proc/sys/kernel/timer_migration /proc/sys/vm/stat_interval "
    "/proc/sys/kernel/numa_balancing /sys/kernel/mm/ksm/run "
    "/sys/kernel/mm/transparent_hugepage/enabled "
    "/sys/devices/system/cpu/cpu*/power/pm_qos_resume_latency_us"
)

ROLLBACK = """
from pathlib import Path
from hpcvm.tune import engine, registry
from hpcvm.tune.errors import TuneError
from hpcvm.tune.model import Change, TuneTarget
from hpcvm.tune.settings.base import Setting

class Broken(Setting):
    name = "broken"
    what = "kernel.timer_migration=7: out of range, the kernel answers EINVAL"
    def lacking(self): return None
    def check(self, target): return self.row("7", "-", False)
    def changes(self, target):
        p = "/proc/sys/kernel/timer_migration"
        raw = Path(p).read_text()
        return [Change(setting="broken", path=p, before=raw, value="7", restore=raw.strip())]

table = {}
for name, setting in registry.REGISTRY.items():
    table[name] = setting
    if name == "watchdog_cpumask":
        table["broken"] = Broken()
target = TuneTarget(vcpu_pus=(1,), housekeeping_pus=(0,), source="guest test")
try:
    engine.apply(target, Path("/run/tune-rollback"), registry=table)
except TuneError as exc:
    print("ROLLBACK-ERROR", exc)
print("STATE-LEFT", Path("/run/tune-rollback/state.json").exists())
"""

SCRIPT = f"""
snap() {{ for f in {FILES}; do [ -e "$f" ] && printf '%s: %s\\n' "$f" "$(cat "$f")"; done; }}
export HPCVM_TUNE_DIR=/run/hpcvm-tune
snap > /run/before
{HPCVM} tune --apply --vcpu-pus 1 --housekeeping-pus 0 > /run/apply.out 2>&1
echo "APPLY-RC $?"
snap > /run/applied
{HPCVM} tune --check --json > /run/check.json; echo "CHECK-RC $?"
echo "CHECK-JSON $(tr -d '\\n' < /run/check.json)"
echo "TIMER-MIGRATION $(cat /proc/sys/kernel/timer_migration)"
echo "IRQ-MASKS $(cat /proc/irq/[0-9]*/smp_affinity | tr '\\n' ' ')"
echo "REFUSED $(grep -c 'keeps /proc/irq' /run/apply.out)"
{HPCVM} tune --revert > /run/revert.out 2>&1; echo "REVERT-RC $?"
snap > /run/after
cmp -s /run/before /run/after && echo "REVERT-EXACT yes" || diff /run/before /run/after
cmp -s /run/before /run/applied || echo "APPLY-CHANGED yes"
{PYTHON} -c '{ROLLBACK}'
snap > /run/rolled
cmp -s /run/before /run/rolled && echo "ROLLBACK-EXACT yes" || diff /run/before /run/rolled
"""


def _markers(stdout: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        key, _, value = line.partition(" ")
        if key.isupper() and key.replace("-", "").isalpha():
            found[key] = value
    return found


@pytest.mark.usefixtures("guest")
def test_apply_check_revert_and_rollback_inside_a_guest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "run"))
    monkeypatch.setenv("HPCVM_READY_TIMEOUT", "120")
    share = ["--share", sys.base_prefix] if not sys.base_prefix.startswith("/usr") else []
    done = subprocess.run(
        [HPCVM, "run", *share, "--profile", "naive", "--vcpus", "2", "--memory", "512M",
         "--timeout", "500", "--", "/bin/bash", "-c", SCRIPT],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    got = _markers(done.stdout)
    assert got.get("APPLY-RC") == "0", done.stdout
    assert got.get("APPLY-CHANGED") == "yes", done.stdout
    assert got.get("TIMER-MIGRATION") == "0"
    rows = {r["name"]: r for r in json.loads(got["CHECK-JSON"])}
    for name in ("irq_default_affinity", "workqueue_cpumask", "watchdog_cpumask",
                 "timer_migration", "stat_interval", "numa_balancing", "ksm", "thp"):  # fmt: skip
        assert rows[name]["ok"] is True, rows[name]
    # the guest kernel's own view, in the mask form hpcvm does not write: only the IRQs
    # the kernel refused to move (apply warned about each) may still reach CPU 1
    masks = [parse_mask(m) for m in got["IRQ-MASKS"].split()]
    assert masks
    assert sum(1 for m in masks if m != {0}) == int(got["REFUSED"]), done.stdout
    assert got.get("REVERT-RC") == "0", done.stdout
    assert got.get("REVERT-EXACT") == "yes", done.stdout
    assert "Invalid argument" in got.get("ROLLBACK-ERROR", ""), done.stdout
    assert "rolled back" in got["ROLLBACK-ERROR"]
    assert got.get("STATE-LEFT") == "False"
    assert got.get("ROLLBACK-EXACT") == "yes", done.stdout


@pytest.mark.usefixtures("guest")
def test_check_for_a_running_vm_uses_its_pinned_pus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "run"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    monkeypatch.setenv("HPCVM_READY_TIMEOUT", "120")
    up = subprocess.run(
        [HPCVM, "up", "--name", "tq", "--profile", "pinned", "--vcpus", "1", "--memory", "256M"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        # oracle: the machine record as written by `up`, read without hpcvm's models
        record = json.loads((root / "tq" / "machine.json").read_text())
        pu = record["plan"]["placements"][0]["host_pu"]
        done = subprocess.run(
            [HPCVM, "tune", "--check", "--json", "--for", "tq", "--state-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        wanted = {r["name"]: r["wanted"] for r in json.loads(done.stdout)}
        if pu == 0:  # the kernel's boot CPU is never isolated at boot (issue 36)
            assert all(wanted[n].startswith("none") for n in ("nohz_full", "isolcpus")), wanted
        else:
            assert wanted["nohz_full"] == f"nohz_full={pu}"
            assert wanted["isolcpus"] == f"isolcpus=managed_irq,domain,{pu}"
        assert str(pu) not in wanted["irqaffinity"].removeprefix("irqaffinity=").split(",")
    finally:
        subprocess.run([HPCVM, "down", "tq"], capture_output=True, timeout=300)
