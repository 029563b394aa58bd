"""A VM whose `up` was killed between QEMU's start and its record: `down` (and the
cluster's reaper, which calls it) finds QEMU by its own pidfile and kills it, but only
a process whose command line names this VM. Real processes stand in for QEMU (a
Python sleeping with QEMU's ``-name guest=NAME,`` words), so no guest is booted; the
kernel (waitpid) is the oracle for what was killed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpcvm.bootspec import BootSpec
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.vm import stopping


@pytest.fixture
def runtime_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path))
    return tmp_path


Starter = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def sleeper() -> Iterator[Starter]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*words: str) -> subprocess.Popen[bytes]:
        """The stand-in, once its command line is readable: QEMU writes its pidfile
        itself, long after exec, whereas Popen returns as soon as exec closed the
        descriptors, before the kernel set the new argv (/proc/PID/cmdline reads empty
        for a moment: down then rightly declined to kill, and the test failed)."""
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *words])
        procs.append(proc)
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        deadline = time.monotonic() + 10
        while words[-1].encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _record(name: str, run_dir: Path) -> str:
    """A Machine record as `up` saves it before QEMU starts: a real plan, pid None."""
    from hpcvm.host import discover
    from hpcvm.plan import plan
    from hpcvm.plan.model import PlanRequest
    from hpcvm.runtime.machine.model import Machine

    request = PlanRequest(name=name, profile="naive", vcpus=1, memory_bytes=256 << 20, accel="tcg")
    machine = Machine(
        name=name,
        backend="qemu",
        run_dir=str(run_dir),
        pid=None,
        started_at=0.0,
        plan=plan(discover(), request),
        boot=BootSpec(),
        image="builtin",
    )
    return machine.model_dump_json()


def _unrecorded(root: Path, name: str, pid: int) -> Path:
    run_dir = root / name
    run_dir.mkdir()
    (run_dir / paths.PID_FILE).write_text(f"{pid}\n")
    return run_dir


def test_down_kills_the_qemu_its_pidfile_names_and_removes_the_run_dir(
    runtime_root: Path, sleeper: Starter
) -> None:
    proc = sleeper("-name", "guest=vm1,debug-threads=on")
    run_dir = _unrecorded(runtime_root, "vm1", proc.pid)
    stopping.down("vm1")
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # say what down saw (one CI run got here once)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        pytest.fail(f"down left pid {proc.pid} running: its cmdline {cmdline!r}")
    assert code == -9
    assert not run_dir.exists()


def test_a_record_without_a_pid_is_no_reason_to_leave_qemu_running(
    runtime_root: Path, sleeper: Starter
) -> None:
    """The record `up` writes before QEMU starts (pid None), then SIGKILL."""
    proc = sleeper("-name", "guest=vm2,debug-threads=on")
    run_dir = _unrecorded(runtime_root, "vm2", proc.pid)
    (run_dir / paths.MACHINE_FILE).write_text(_record("vm2", run_dir))
    stopping.down("vm2")
    assert proc.wait(timeout=10) == -9
    assert not run_dir.exists()


def test_down_leaves_a_process_that_is_not_this_vms_qemu(
    runtime_root: Path, sleeper: Starter
) -> None:
    other = sleeper("-name", "guest=vm10,debug-threads=on")
    run_dir = _unrecorded(runtime_root, "vm1", other.pid)  # a recycled pid
    stopping.down("vm1")
    assert other.poll() is None
    assert not run_dir.exists()
