"""`hpcvm tune` on this machine's real kernel: apply, check and revert restore every file
byte for byte; a failure midway (the kernel refusing a value) rolls back; a process
killed midway is undone by --revert; two applies cannot interleave.

These tests change the host's IRQ affinities and sysctls for a few seconds. The
``guard`` fixture records every file tuning may touch (read independently of hpcvm: the
IRQs' hex masks as well as their lists) and, whatever happens, reverts and checks that
the host is back as it was.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.tune import engine, state
from hpcvm.tune.cpumask import parse_mask
from hpcvm.tune.errors import TuneError
from hpcvm.tune.model import Change, Row, TuneTarget
from hpcvm.tune.registry import REGISTRY
from hpcvm.tune.settings.base import Setting
from hpcvm.tune.target import online_pus

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing host tuning needs root")

FIXED = (
    "/proc/irq/default_smp_affinity",
    "/sys/devices/virtual/workqueue/cpumask",
    "/proc/sys/kernel/watchdog_cpumask",
    "/proc/sys/kernel/timer_migration",
    "/proc/sys/vm/stat_interval",
    "/proc/sys/kernel/numa_balancing",
    "/sys/kernel/mm/ksm/run",
    "/sys/kernel/mm/transparent_hugepage/enabled",
)


def host_files() -> dict[str, bytes]:
    """Every file tuning may write, and the IRQs' masks, as raw bytes."""
    paths = [Path(p) for p in FIXED]
    paths += sorted(Path("/proc/irq").glob("[0-9]*/smp_affinity*"))
    paths += sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor"))
    paths += sorted(
        Path("/sys/devices/system/cpu").glob("cpu[0-9]*/power/pm_qos_resume_latency_us")
    )
    return {str(p): p.read_bytes() for p in paths if p.exists()}


def sysctl(key: str) -> str:
    done = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def target() -> TuneTarget:
    online = sorted(online_pus())
    if len(online) < 2:
        pytest.fail("tuning needs two online PUs: one to quiet, one for housekeeping")
    return TuneTarget(vcpu_pus=(online[-1],), housekeeping_pus=(online[0],), source="test")


@pytest.fixture
def guard(tmp_path: Path) -> Iterator[Path]:
    """A state directory; afterwards: revert whatever is saved there and fail unless the
    host's files are exactly as before (putting back by hand what revert missed)."""
    before = host_files()
    directory = tmp_path / "tune"
    try:
        yield directory
    finally:
        if (directory / state.STATE_FILE).exists():
            engine.revert(directory)
        after = host_files()
        changed = [p for p, raw in before.items() if after.get(p) != raw]
        for path in changed:  # last resort: put the old text back
            value = before[path].decode().strip()
            if "[" in value:
                value = value.split("[")[1].split("]")[0]
            if not path.endswith("/smp_affinity"):
                Path(path).write_text(value)
        assert not changed, f"not restored: {changed}"


def test_apply_check_revert_restores_every_byte(target: TuneTarget, guard: Path) -> None:
    before = host_files()
    result = engine.apply(target, guard)
    assert result.changes, "this host needed no change: nothing was tested"
    house = set(target.housekeeping_pus)
    # independent oracles: sysctl(8) and the IRQs' hex masks (hpcvm writes lists)
    assert sysctl("kernel.timer_migration") == "0"
    assert int(sysctl("vm.stat_interval")) >= 10
    for irq in Path("/proc/irq").glob("[0-9]*"):
        if str(irq / "smp_affinity_list") not in result.refused:
            assert parse_mask((irq / "smp_affinity").read_text()) <= house, irq
    assert parse_mask(Path("/proc/irq/default_smp_affinity").read_text()) <= house
    rows = {r.name: r for r in engine.check(target)}
    assert all(rows[c.setting].ok for c in result.changes if c.setting != "irq_affinity")
    saved = state.load(guard)
    assert saved is not None and saved.complete
    assert [c.path for c in saved.changes] == [c.path for c in result.changes]
    assert all(before[c.path].decode() == c.before for c in saved.changes)

    reverted = engine.revert(guard)
    assert len(reverted.restored) == len(result.changes)
    assert host_files() == before
    assert not (guard / state.STATE_FILE).exists()


class _Broken(Setting):
    """A setting whose write the kernel refuses: 7 is out of kernel.timer_migration's
    0..1 range, so the write fails with EINVAL (a real failure, not a mock)."""

    name = "broken"
    what = "writes a value the kernel rejects"

    def lacking(self) -> str | None:
        return None

    def check(self, target: TuneTarget) -> Row:
        return self.row("7", "-", False)

    def changes(self, target: TuneTarget) -> list[Change]:
        path = "/proc/sys/kernel/timer_migration"
        raw = Path(path).read_text()
        return [Change(setting=self.name, path=path, before=raw, value="7", restore=raw.strip())]


def _with(extra: Setting, after: str) -> dict[str, Setting]:
    """The real registry with ``extra`` inserted after the setting ``after``."""
    out: dict[str, Setting] = {}
    for name, setting in REGISTRY.items():
        out[name] = setting
        if name == after:
            out[extra.name] = extra
    return out


def test_a_failure_midway_rolls_back_everything(target: TuneTarget, guard: Path) -> None:
    registry = _with(_Broken(), after="watchdog_cpumask")
    head = list(registry)[: list(registry).index("broken")]
    earlier = engine.planned_changes(target, {n: registry[n] for n in head})
    assert earlier, "nothing would be written before the failure: the rollback is untested"
    before = host_files()
    with pytest.raises(TuneError, match="Invalid argument") as info:
        engine.apply(target, guard, registry=registry)
    assert "rolled back" in str(info.value)
    assert host_files() == before
    assert not (guard / state.STATE_FILE).exists()


CRASHING_APPLY = """
import sys
from pathlib import Path
from hpcvm.tune import engine, registry
from hpcvm.tune.model import Change, TuneTarget
from hpcvm.tune.settings.base import Setting

class Hang(Setting):
    name = "hang"
    what = "opens a FIFO nobody reads: the write blocks until the process is killed"
    def lacking(self): return None
    def check(self, target): return self.row("-", "-", False)
    def changes(self, target):
        return [Change(setting="hang", path=sys.argv[2], before="", value="x", restore="")]

table = {}
for name, setting in registry.REGISTRY.items():
    table[name] = setting
    if name == "watchdog_cpumask":
        table["hang"] = Hang()
target = TuneTarget.model_validate_json(sys.argv[3])
engine.apply(target, Path(sys.argv[1]), registry=table)
"""


def test_revert_after_a_crash_midway(target: TuneTarget, guard: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "hang.fifo"
    os.mkfifo(fifo)
    before = host_files()
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_APPLY, str(guard), str(fifo), target.model_dump_json()]
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            saved = state.load(guard) if (guard / state.STATE_FILE).exists() else None
            if saved and saved.changes and saved.changes[-1].path == str(fifo):
                break
            assert proc.poll() is None, "the apply ended before it reached the FIFO"
            time.sleep(0.1)
        else:
            pytest.fail("the apply never reached the FIFO")
        assert host_files() != before, "nothing was written before the crash"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        fifo.unlink()  # the hang device is the test's, not the host's: revert skips it as gone
    saved = state.load(guard)
    assert saved is not None and not saved.complete
    done = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "tune", "--revert", "--state-dir", str(guard)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"{fifo} no longer exists" in done.stderr
    assert host_files() == before


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "tune", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_apply_is_refused_while_one_runs_or_is_applied(
    target: TuneTarget, guard: Path
) -> None:
    vcpus = str(target.vcpu_pus[0])
    with state.locked(guard):
        busy = _cli("--apply", "--vcpu-pus", vcpus, "--state-dir", str(guard))
    assert busy.returncode == 8, busy.stderr
    assert f"pid {os.getpid()}" in busy.stderr
    assert not (guard / state.STATE_FILE).exists()

    first = _cli("--apply", "--vcpu-pus", vcpus, "--state-dir", str(guard))
    assert first.returncode == 0, first.stderr
    saved = (guard / state.STATE_FILE).read_bytes()
    again = _cli("--apply", "--vcpu-pus", vcpus, "--state-dir", str(guard))
    assert again.returncode == 2 and "already applied" in again.stderr
    assert (guard / state.STATE_FILE).read_bytes() == saved  # the originals are kept


def test_an_apply_from_another_state_dir_is_refused_while_one_is_applied(
    target: TuneTarget, guard: Path, tmp_path: Path
) -> None:
    """The host is one, whatever --state-dir says: a second apply from another directory
    would save the first one's tuned values as the originals."""
    vcpus = str(target.vcpu_pus[0])
    other = tmp_path / "other-tune"
    first = _cli("--apply", "--vcpu-pus", vcpus, "--state-dir", str(guard))
    assert first.returncode == 0, first.stderr
    try:
        second = _cli("--apply", "--vcpu-pus", vcpus, "--state-dir", str(other))
        assert second.returncode == 2, second.stderr
        assert f"already applied from state dir {guard}" in second.stderr
        assert not (other / state.STATE_FILE).exists()
    finally:
        reverted = _cli("--revert", "--state-dir", str(guard))
    assert reverted.returncode == 0, reverted.stderr
    assert not (state.host_dir() / state.HOST_RECORD).exists()
    # Reverted, the host is free for the other directory.
    again = _cli("--apply", "--vcpu-pus", vcpus, "--state-dir", str(other))
    try:
        assert again.returncode == 0, again.stderr
    finally:
        assert _cli("--revert", "--state-dir", str(other)).returncode == 0
