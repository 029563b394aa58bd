"""`hpcvm exec` in a real booted built-in guest (TCG), as a user runs it: interrupted
with SIGINT or SIGTERM, or past --timeout, it ends the command in the guest (checked
from inside the guest with another exec reading /proc) and exits 130 or 124 with one
line; stdin piped in arrives; a missing program is 127, one not executable 126. And a
VM whose owning hpcvm process (`hpcvm run`, bench's VM environment) is killed with
SIGKILL is "orphaned" in `hpcvm ps`, which `hpcvm down --orphans` takes down (its QEMU
gone from /proc), while a VM of plain `hpcvm up` is not an orphan.

And `exec`, `ps`, `down` and `cluster exec` import neither pydantic nor the planner nor
QMP's asyncio client on the way (issue 37).

One VM (plain `up`) serves every test of the module; the orphan tests boot one owned
VM each, the test of `down` one to take down. The guest command writes its pid into a
shared directory, so the test signals hpcvm only once the command runs in the guest
(QEMU's agent socket serves one client at a time: no second exec can ask while the
first waits).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runtime_support import HPCVM, interruptible, qemu_pids_using

pytestmark = pytest.mark.integration

SHAPE = ["--profile", "naive", "--vcpus", "1", "--memory", "256M", "--accel", "tcg"]
GUEST_SHARE = "/mnt/hpcvm-exec-test"


@dataclass(frozen=True)
class Vm:
    name: str
    runtime: Path
    shared: Path  # the host side of GUEST_SHARE (read-write)

    def env(self) -> dict[str, str]:
        return {**os.environ, "HPCVM_RUNTIME_DIR": str(self.runtime)}

    def hpcvm(
        self, *args: str, input: str | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """``hpcvm`` with this module's runtime dir; stdin is ``input`` (else empty)."""
        return subprocess.run(
            [HPCVM, *args],
            input=input if input is not None else "",
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [HPCVM, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(),
            preexec_fn=interruptible,
        )

    def popen_python(self, script: str, *args: str) -> subprocess.Popen[str]:
        """This Python (hpcvm's) running ``script`` with this module's runtime dir."""
        return subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(),
        )

    def ps(self) -> dict[str, dict[str, object]]:
        done = self.hpcvm("ps", "--json")
        assert done.returncode == 0, done.stderr
        return {row["name"]: row for row in json.loads(done.stdout)}


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory, guest: None) -> Iterator[Vm]:
    # Under /tmp, not pytest's 0700 directory: QEMU runs as its own user, which must
    # reach and write the share (as in test_isolation.py).
    shared = Path(tempfile.mkdtemp(prefix="hpcvm-exec-signals-", dir="/tmp"))
    shared.chmod(0o777)
    here = Vm(f"sig{os.getpid()}", tmp_path_factory.mktemp("exec-signals") / "rt", shared)
    try:
        up = here.hpcvm(
            "up", "--name", here.name, *SHAPE, "--share", f"{shared}:{GUEST_SHARE}:rw", timeout=600
        )
        assert up.returncode == 0, up.stderr
        yield here
    finally:
        here.hpcvm("down", "--all", timeout=300)
        shutil.rmtree(shared, ignore_errors=True)
        assert qemu_pids_using(here.runtime) == set()


def _guest_process(vm: Vm, pid: int) -> str:
    """What the guest's /proc says of ``pid``: its state letter, or "" when gone."""
    probe = vm.hpcvm(
        "exec", vm.name, "--", "/bin/sh", "-c",
        'IFS= read -r l 2>/dev/null </proc/$1/stat || exit 0; r=${l##*) }; echo "${r%% *}"',
        "sh", str(pid),
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    return probe.stdout.strip()


def _sleepers(vm: Vm, seconds: str) -> list[str]:
    """Guest processes running ``sleep <seconds>`` (read from /proc/*/cmdline)."""
    probe = vm.hpcvm(
        "exec", vm.name, "--", "/bin/sh", "-c",
        'for f in /proc/[0-9]*/cmdline; do [ "$(tr "\\0" " " <"$f" 2>/dev/null)" = "sleep $1 " ]'
        ' && echo "${f%/cmdline}"; done; true',
        "sh", seconds,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    return probe.stdout.split()


def _started(vm: Vm, proc: subprocess.Popen[str], marker: Path) -> int:
    """The guest pid the command wrote into the share, once it has."""
    deadline = time.monotonic() + 120
    while not (marker.exists() and marker.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the guest command did not start in 120 s"
        time.sleep(0.1)
    return int(marker.read_text())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signalled_exec_ends_its_command_in_the_guest(vm: Vm, signum: int) -> None:
    marker = vm.shared / f"pid-{signum}"
    seconds = f"30{signum}"  # 302, 3015: told apart from other tests' sleeps
    script = f"sleep {seconds} & echo $$ > {GUEST_SHARE}/{marker.name}; wait"
    proc = vm.popen("exec", vm.name, "--", "/bin/sh", "-c", script)
    pid = _started(vm, proc, marker)
    time.sleep(1)  # the sleep child forked; let it exec
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcvm: interrupted; "), err
    assert f"pid {pid} in the guest" in lines[0] and "killed" in lines[0], err
    assert _guest_process(vm, pid) in ("", "Z")
    assert _sleepers(vm, seconds) == []


def test_a_timed_out_exec_ends_its_command_in_the_guest(vm: Vm) -> None:
    done = vm.hpcvm("exec", "--timeout", "3", vm.name, "--", "/bin/sh", "-c", "sleep 304 & wait")
    assert done.returncode == 124, done.stderr
    assert "did not finish within 3 s" in done.stderr and "killed" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert _sleepers(vm, "304") == []


def test_stdin_reaches_the_command(vm: Vm) -> None:
    done = vm.hpcvm("exec", vm.name, "--", "cat", input="hi\n")
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    data = "".join(f"line {i}\n" for i in range(20000))  # ~200 KB, more than a pipe holds
    counted = vm.hpcvm("exec", vm.name, "--", "wc", "-l", input=data)
    assert counted.stdout.split() == ["20000"], counted.stderr
    kept = vm.hpcvm("exec", "--no-stdin", vm.name, "--", "cat", input="not read\n")
    assert (kept.returncode, kept.stdout) == (0, ""), kept.stderr


def test_a_missing_program_is_127_and_a_non_executable_126(vm: Vm) -> None:
    missing = vm.hpcvm("exec", vm.name, "--", "no-such-program-hpcvm")
    assert missing.returncode == 127, missing.stderr
    assert missing.stderr.startswith("hpcvm: error: no-such-program-hpcvm: command not found")
    assert len(missing.stderr.strip().splitlines()) == 1
    data_file = vm.hpcvm("exec", vm.name, "--", "/etc/passwd")  # mode 644
    assert data_file.returncode == 126, data_file.stderr
    assert "Traceback" not in missing.stderr + data_file.stderr


# `hpcvm exec` run in this interpreter, then the modules it imported on the way (the
# probe of tests/unit/test_cli_help.py, here with a real guest at the other end).
EXEC_PROBE = """
import json, sys
from hpcvm.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""
HEAVY = ("pydantic", "scipy", "numpy", "matplotlib", "rich", "qemu", "asyncio")


def test_exec_imports_neither_the_models_nor_the_planner(vm: Vm) -> None:
    """Scripts call exec in loops (issue 37): it reads the record without pydantic and
    talks to the agent, so none of the models, the planner or QMP's asyncio come in."""
    proc = vm.popen_python(EXEC_PROBE, "exec", vm.name, "--", "/bin/echo", "probe")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    said = json.loads(out.splitlines()[-1])
    assert said["code"] == 0 and out.startswith("probe\n"), out
    modules: list[str] = said["modules"]
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert heavy == [], heavy
    assert not [m for m in modules if m.startswith(("hpcvm.plan.", "hpcvm.host."))
                and m not in ("hpcvm.plan.names", "hpcvm.host.privilege")], modules  # fmt: skip
    assert "hpcvm.runtime.channels.agent" in modules  # it did reach the guest through the agent


def _imports(vm: Vm, *argv: str, cwd: str | None = None) -> tuple[int, str, list[str]]:
    """``hpcvm ARGV`` run by EXEC_PROBE: its exit code, its output, what it imported."""
    done = subprocess.run(
        [sys.executable, "-c", EXEC_PROBE, *argv], stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=300, env=vm.env(), cwd=cwd, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    *out, last = done.stdout.splitlines()
    said = json.loads(last)
    return said["code"], "\n".join(out), said["modules"]


def _loaded(modules: list[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """``heavy`` packages, and the planner's and the host reader's modules, imported."""
    found = sorted(m for m in modules if m.split(".")[0] in heavy)
    return found + [m for m in modules if m.startswith(("hpcvm.plan.", "hpcvm.host."))
                    and m not in ("hpcvm.plan.names", "hpcvm.host.privilege")]  # fmt: skip


def test_ps_imports_neither_the_models_nor_qmps_asyncio(vm: Vm) -> None:
    """Listing VMs of hpcvm's QEMU backend reads their records without pydantic and asks
    their QEMU over QMP's plain socket (issue 37); rich only draws the table."""
    code, out, modules = _imports(vm, "ps", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0 and rows[vm.name]["state"] == "running", out
    assert Path(f"/proc/{rows[vm.name]['pid']}/cmdline").read_bytes().startswith(b"qemu")
    assert _loaded(modules) == []
    assert "hpcvm.runtime.channels.qmp_line" in modules  # it did ask QEMU
    code, out, modules = _imports(vm, "ps")
    assert code == 0 and vm.name in out and "running" in out, out
    assert _loaded(modules, tuple(h for h in HEAVY if h != "rich")) == []


def test_down_imports_neither_the_models_nor_qmps_asyncio(vm: Vm) -> None:
    """A VM of hpcvm's QEMU backend without NICs is stopped from its record read without
    pydantic: its guest asked to power off through the agent, QEMU gone, its files
    removed (issue 37)."""
    name = f"dn{os.getpid()}"
    up = vm.hpcvm("up", "--name", name, *SHAPE, timeout=600)
    assert up.returncode == 0, up.stderr
    try:
        qemu = int(str(vm.ps()[name]["pid"]))
        code, out, modules = _imports(vm, "down", name)
        assert (code, out) == (0, f"{name}: down")
        assert not _qemu_runs(qemu) and not (vm.runtime / name).exists()
        assert _loaded(modules) == []
        assert "hpcvm.runtime.channels.agent" in modules  # the guest was asked to power off
    finally:
        vm.hpcvm("down", name)


def test_cluster_exec_imports_neither_the_models_nor_the_planner(
    vm: Vm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cluster exec` reads the job's record and events and the first VM's record
    without pydantic and runs the command through that VM's agent (issue 37). The job
    is this module's VM as the first VM of a one-node `local` job, its state written
    by hpcvm's own models, a sleeping process standing in for its holder step; no
    batch system needed."""
    from hpcvm.cluster.job import state as job_state
    from hpcvm.cluster.job.spec import NodeEvent

    monkeypatch.setenv("HPCVM_RUNTIME_DIR", str(vm.runtime))
    name = f"job{os.getpid()}"
    with subprocess.Popen(["sleep", "600"]) as holder:
        try:
            job_state.clusters_dir()
            job_state.cluster_dir(name).mkdir(mode=0o700)
            job_state.write_record(job_state.ClusterRecord(
                name=name, batch="local", job_id="1", nodes=("local1",),
                holder_pid=holder.pid, network="10.77.0.0/24", vcpus=1,
            ))  # fmt: skip
            ready = NodeEvent(event="ready", node="local1", index=0, vm=vm.name)
            (job_state.cluster_dir(name) / "holder.log").write_text(ready.line() + "\n")
            probe = 'echo "$PWD $OMPI_MCA_btl_tcp_if_include"'
            code, out, modules = _imports(
                vm, "cluster", "exec", name, "--", "/bin/sh", "-c", probe, cwd="/"
            )
            assert (code, out) == (0, "/ 10.77.0.0/24")
            assert _loaded(modules) == []
            assert "hpcvm.runtime.channels.agent" in modules
        finally:
            holder.kill()
            job_state.remove(name)


# bench's VM environment as `hpcvm bench` starts it (bench/envs/vm.py), in a process that
# then waits as a bench between samples does; argv[1] is the VM's name.
BENCH_OWNER = """
import sys, time
from hpcvm.bench.envs.vm import VmEnvironment, plan_vm
plan, _ = plan_vm("naive", vcpus=1, memory_bytes=256 << 20)
VmEnvironment(plan, vm_name=sys.argv[1]).start()
time.sleep(600)
"""


@pytest.mark.parametrize("owner_kind", ["run", "bench"])
def test_a_killed_owner_leaves_an_orphan_that_down_orphans_takes_down(
    vm: Vm, owner_kind: str
) -> None:
    name = f"own{os.getpid()}{owner_kind[0]}"
    if owner_kind == "run":
        owner = vm.popen("run", "--name", name, *SHAPE, "--", "sleep", "600")
        settled = "running"
    else:
        owner = vm.popen_python(BENCH_OWNER, name)
        settled = "paused"  # bench pauses a VM while it is not measured
    try:
        row = _wait_for(vm, name, settled, owner)
        assert row["owner"] == f"pid {owner.pid} (hpcvm {owner_kind})"
        qemu = int(str(row["pid"]))
        os.kill(owner.pid, signal.SIGKILL)
        owner.communicate(timeout=60)
        rows = vm.ps()
        assert rows[name]["state"] == "orphaned", rows[name]
        assert rows[name]["note"] == f"{settled}; its owner {row['owner']} is gone"
        assert rows[vm.name]["state"] == "running" and rows[vm.name]["owner"] == ""
        table = vm.hpcvm("ps").stdout
        assert "orphaned" in table, table

        down = vm.hpcvm("down", "--orphans")
        assert down.returncode == 0, down.stderr
        assert f"{name}: down" in down.stdout and vm.name not in down.stdout
        assert not _qemu_runs(qemu)
        assert set(vm.ps()) == {vm.name}  # the plain up's VM is no orphan: left running
        again = vm.hpcvm("down", "--orphans")
        assert (again.returncode, again.stdout.strip()) == (0, "no orphaned VMs")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.communicate()
        vm.hpcvm("down", name)


def _wait_for(vm: Vm, name: str, state: str, owner: subprocess.Popen[str]) -> dict[str, object]:
    """``name``'s row of ``ps --json`` once its state is ``state``."""
    deadline = time.monotonic() + 600
    while True:
        row = vm.ps().get(name)
        if row is not None and row["state"] == state:
            return row
        assert owner.poll() is None, owner.communicate()
        assert time.monotonic() < deadline, f"{name} did not come up in 600 s"
        time.sleep(0.5)


def _qemu_runs(pid: int) -> bool:
    """Whether ``pid`` is still a live (non-zombie) process, read from /proc."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X"):
            return False
        time.sleep(0.2)
    return True
