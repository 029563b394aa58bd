"""up / exec / ps / down through the real CLI, with the built-in guest under TCG.

Each test runs in its own runtime directory and ends by checking that nothing is left:
no QEMU process started from that directory, no run dir or socket, no hpcvm hugetlbfs
file, no more huge pages in use, no new tap device (tests/runtime_support.py).
Expected values come from the plan the test reads back or from /proc and the guest,
never from the code under test's own answers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm import procs
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from tests.runtime_support import (
    HPCVM,
    Residue,
    assert_nothing_left,
    hpcvm,
    interruptible,
    one_line_error,
    reserve_hugepages,
)

pytestmark = pytest.mark.integration

PAGE_2M = 2 * 1024 * 1024
PVM_HOST = Path("/sys/module/kvm_pvm").exists()


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guest: None) -> Iterator[Path]:
    root = tmp_path / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    monkeypatch.setenv("HPCVM_READY_TIMEOUT", "120")
    before = Residue.take(root)
    yield root
    # Whatever the test did, bring its VMs down before checking for leftovers.
    subprocess.run([HPCVM, "down", "--all", "--timeout", "10"], capture_output=True)
    assert_nothing_left(before)


def record(name: str) -> Machine:
    return state.load_machine(name)


def cpus_allowed(pid: int, tid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("Cpus_allowed_list:"))
    out: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def wait_for_agent_client(sock: Path, timeout: float = 60.0) -> None:
    """Until a client is connected to the socket (a connected entry for its path in
    /proc/net/unix, state 03). For the agent's relay socket (not QEMU's agent socket,
    which the relay holds from the start: runtime/channels/agent_relay.py): `hpcvm
    exec` has started talking to the guest."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == str(sock) and fields[5] == "03":
                return
        time.sleep(0.05)
    raise AssertionError(f"no client connected to {sock} within {timeout} s")


def qemu_hugetlb_bytes(pid: int) -> int:
    """Huge page memory QEMU has mapped, from its smaps_rollup."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return sum(
        int(ln.split()[1]) * 1024
        for ln in text.splitlines()
        if ln.startswith(("Private_Hugetlb:", "Shared_Hugetlb:"))
    )


def vcpu_tids_by_name(pid: int) -> dict[int, int]:
    """vCPU index -> tid from QEMU's thread names ("CPU 1/TCG"), not from QMP."""
    found: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        if comm.startswith("CPU ") and "/" in comm:
            found[int(comm[4 : comm.index("/")])] = int(tid)
    return found


CASES = {
    "naive": ["--profile", "naive", "--vcpus", "2", "--memory", "512M"],
    "pinned": ["--profile", "pinned", "--vcpus", "2", "--memory", "512M"],
    "hugepages": ["--profile", "hugepages", "--vcpus", "1", "--memory", "256M"],
    "numa": ["--profile", "numa", "--vcpus", "2", "--memory", "512M", "--guest-nodes", "2"],
    "hpc": ["--profile", "hpc", "--vcpus", "1", "--memory", "256M"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_up_exec_down(runtime: Path, case: str) -> None:
    reserve_hugepages(256 + 16)
    up = hpcvm("up", "--name", case, *CASES[case])
    assert up.returncode == 0, up.stderr
    machine = record(case)
    plan = machine.plan
    assert machine.pid is not None and state.is_qemu_process(machine.pid)
    if PVM_HOST:
        assert plan.accel == "tcg"  # --accel auto on a PVM host

    nproc = hpcvm("exec", case, "--", "nproc")
    assert nproc.returncode == 0, nproc.stderr
    assert int(nproc.stdout) == plan.vcpus

    online = hpcvm("exec", case, "--", "cat", "/sys/devices/system/node/online")
    expected_nodes = f"0-{len(plan.guest_nodes) - 1}" if len(plan.guest_nodes) > 1 else "0"
    assert online.stdout.strip() == expected_nodes

    tids = vcpu_tids_by_name(machine.pid)
    assert sorted(tids) == list(range(plan.vcpus))
    for p in plan.placements:
        if p.host_pu is not None:
            assert cpus_allowed(machine.pid, tids[p.vcpu]) == {p.host_pu}
    if plan.emulator_pus:
        others = set(map(int, os.listdir(f"/proc/{machine.pid}/task"))) - set(tids.values())
        assert others
        for tid in others:
            assert cpus_allowed(machine.pid, tid) == set(plan.emulator_pus)

    huge_needed = sum(plan.hugepages_needed.values()) if plan.page_size_bytes == PAGE_2M else 0
    if huge_needed:
        assert qemu_hugetlb_bytes(machine.pid) >= huge_needed * PAGE_2M  # prealloc'd
        assert machine.hugetlbfs_dirs and all(Path(d).is_dir() for d in machine.hugetlbfs_dirs)
    else:
        assert qemu_hugetlb_bytes(machine.pid) == 0

    listed = json.loads(hpcvm("ps", "--json").stdout)
    assert [(r["name"], r["state"], r["pid"]) for r in listed] == [(case, "running", machine.pid)]

    down = hpcvm("down", case)
    assert down.returncode == 0, down.stderr
    assert not procs.pid_alive(machine.pid, reap=True)
    assert not Path(machine.run_dir).exists()


def test_exec_passes_output_and_exit_code(runtime: Path) -> None:
    assert hpcvm("up", "--name", "x", *CASES["naive"]).returncode == 0
    done = hpcvm("exec", "x", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")
    no_shell = hpcvm("exec", "x", "--", "echo", "$HOME", "a;b")
    assert no_shell.stdout == "$HOME a;b\n"  # argv as given, no shell in between


def test_exec_timeout_exits_124(runtime: Path) -> None:
    assert hpcvm("up", "--name", "slow", *CASES["naive"]).returncode == 0
    begin = time.monotonic()
    done = hpcvm("exec", "slow", "--timeout", "3", "--", "sleep", "60")
    assert done.returncode == 124
    assert "within 3 s" in one_line_error(done)
    assert time.monotonic() - begin < 55  # it did not wait for sleep to finish


def test_vm_dying_during_exec_is_a_clear_error(runtime: Path) -> None:
    assert hpcvm("up", "--name", "dies", *CASES["naive"]).returncode == 0
    pid = record("dies").pid
    assert pid is not None
    proc = subprocess.Popen(
        [HPCVM, "exec", "dies", "--", "sleep", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_agent_client(runtime / "dies" / "relay.sock")
    time.sleep(2)  # guest-sync, then guest-exec: `sleep 30` now runs in the guest
    assert proc.poll() is None
    os.kill(pid, signal.SIGKILL)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    assert "died" in err and "\n" not in err.strip()
    listed = json.loads(hpcvm("ps", "--json").stdout)
    assert [(r["name"], r["state"]) for r in listed] == [("dies", "stale")]
    assert not (runtime / "dies").exists()  # ps cleaned the stale entry


def test_qemu_exiting_during_boot_reports_code_and_log(runtime: Path, tmp_path: Path) -> None:
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"not a kernel\n" * 64)
    initrd = tmp_path / "initrd"
    initrd.write_bytes(b"\0" * 512)
    done = hpcvm(
        "up", "--name", "bad", *CASES["naive"], "--kernel", str(kernel), "--initrd", str(initrd)
    )
    assert done.returncode == 5
    line = one_line_error(done)
    assert "exited with code 1" in line and "qemu.log" in line
    named = Path(re.search(r"\(log: (\S+qemu\.log)\)", line).group(1))  # type: ignore[union-attr]
    assert named.is_file() and not (runtime / "bad").exists()  # kept after teardown
    kept = named.read_text().strip().splitlines()
    assert kept and kept[-1] in line  # QEMU's own last words, quoted in the message


def test_agent_never_answering_names_the_console_log(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real kernel with an initrd that is no initramfs: the guest panics (no root)
    and no agent ever answers."""
    from hpcvm.guest import ensure_guest

    image = ensure_guest()
    initrd = tmp_path / "empty-initrd"
    initrd.write_bytes(b"\0" * 4096)
    monkeypatch.setenv("HPCVM_READY_TIMEOUT", "20")
    done = hpcvm(
        "up",
        "--name",
        "mute",
        *CASES["naive"],
        "--kernel",
        str(image.kernel),
        "--initrd",
        str(initrd),
    )
    assert done.returncode == 5
    line = one_line_error(done)
    assert "did not answer within 20 s" in line and "console.log" in line
    named = Path(re.search(r"console log (\S+console\.log)", line).group(1))  # type: ignore[union-attr]
    assert not (runtime / "mute").exists()  # the VM is gone, its console log is not
    assert named.is_file() and named.parent == runtime / paths.FAILED_DIR / "mute"
    assert "Kernel panic" in named.read_text(errors="replace")  # the guest kernel's own words
    assert sorted(p.name for p in named.parent.iterdir()) == ["console.log", "qemu.log"]


def test_ctrl_c_during_up_tears_the_vm_down(runtime: Path) -> None:
    proc = subprocess.Popen(
        [HPCVM, "up", "--name", "intr", *CASES["naive"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    deadline = time.monotonic() + 60
    pid = None
    while pid is None and time.monotonic() < deadline:
        m = state.read_machine(runtime / "intr")
        pid = m.pid if m else None
        time.sleep(0.05)
    assert pid is not None and procs.pid_alive(pid, reap=True), "QEMU never started"
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert not procs.pid_alive(pid, reap=True)
    assert not (runtime / "intr").exists()


def test_name_in_use_is_refused_and_the_vm_untouched(runtime: Path) -> None:
    assert hpcvm("up", "--name", "dup", *CASES["naive"]).returncode == 0
    pid = record("dup").pid
    begin = time.monotonic()
    again = hpcvm("up", "--name", "dup", *CASES["naive"])
    assert again.returncode == 2
    assert "already exists" in one_line_error(again)
    assert time.monotonic() - begin < 30  # refused before booting anything
    assert record("dup").pid == pid and pid is not None and procs.pid_alive(pid, reap=True)


def test_bad_input_is_refused_before_anything_starts(runtime: Path, tmp_path: Path) -> None:
    unknown = hpcvm("exec", "ghost", "--", "true")
    assert unknown.returncode == 2 and "no VM named 'ghost'" in one_line_error(unknown)
    missing = hpcvm("up", "--name", "k", *CASES["naive"], "--kernel", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in one_line_error(missing)
    down = hpcvm("down", "ghost")
    assert down.returncode == 2
    assert not runtime.exists() or list(runtime.iterdir()) == []


@pytest.mark.skipif(not PVM_HOST, reason="this host's KVM is usable")
def test_accel_kvm_refused_on_pvm(runtime: Path) -> None:
    done = hpcvm("up", "--name", "kvm", *CASES["naive"], "--accel", "kvm", timeout=60)
    assert done.returncode == 3
    assert "kvm_pvm" in one_line_error(done)
    assert not runtime.exists() or list(runtime.iterdir()) == []


def test_hpc_two_vcpus_on_two_pus_says_how_to_fit(runtime: Path) -> None:
    if os.cpu_count() != 2:
        pytest.skip("the message is about a 2-PU host")
    done = hpcvm("run", "--profile", "hpc", "--vcpus", "2", "--memory", "1G", "--", "true")
    assert done.returncode == 3
    line = one_line_error(done)
    assert "--housekeeping 0" in line and "--vcpus 1" in line


def test_run_boots_runs_and_always_downs(runtime: Path) -> None:
    done = hpcvm("run", *CASES["pinned"], "--", "sh", "-c", "nproc; exit 3")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "2\n"  # only the command's output: the summary goes to stderr


def test_ctrl_c_during_run_tears_the_vm_down(runtime: Path) -> None:
    proc = subprocess.Popen(
        [HPCVM, "run", "--name", "r", *CASES["naive"], "--", "sleep", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    wait_for_agent_client(runtime / "r" / "relay.sock", timeout=180)
    machine = record("r")
    time.sleep(2)
    assert machine.pid is not None and procs.pid_alive(machine.pid, reap=True)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert not procs.pid_alive(machine.pid, reap=True)
    assert not (runtime / "r").exists()


def test_paused_vm_shows_in_ps_and_down_still_stops_it(runtime: Path) -> None:
    """A paused guest cannot power itself off: down must fall back to QMP quit."""
    from hpcvm.runtime.backends.qemu_backend import QemuBackend

    assert hpcvm("up", "--name", "p", *CASES["naive"]).returncode == 0
    machine = record("p")
    QemuBackend().pause(machine)
    listed = json.loads(hpcvm("ps", "--json").stdout)
    assert [(r["name"], r["state"]) for r in listed] == [("p", "paused")]
    down = hpcvm("down", "p", "--timeout", "8")
    assert down.returncode == 0, down.stderr
    assert machine.pid is not None and not procs.pid_alive(machine.pid, reap=True)
