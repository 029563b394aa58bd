"""What a guest can reach of the host, tried from inside as a user's code would, on both
backends under TCG: a secret in /root, /etc/shadow (through the guest's /etc and through
a direct mount of the 9p share that holds it) and a directory nobody shared stay out of
reach; a --share directory is there, writable on the host only with :rw; QEMU runs as a
user other than root with its seccomp filter on (/proc/PID/status, read here); verify's
share checks pass. Bad --share input is refused in one line before anything starts.

Expected values come from the host's files and /proc, never from hpcvm's own answers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.runtime.channels.agent import GuestAgent
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from hpcvm.runtime.verify.shares import check_shares
from tests.integration.conftest import HugePages
from tests.runtime_support import HPCVM, Residue, assert_nothing_left, hpcvm, one_line_error

pytestmark = pytest.mark.integration

UP = ["--profile", "naive", "--vcpus", "1", "--memory", "512M", "--accel", "tcg"]
BOOT_TIMEOUT = 600.0
PAGE_2M = 2 * 1024 * 1024


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guest: None) -> Iterator[Path]:
    root = tmp_path / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    monkeypatch.setenv("HPCVM_READY_TIMEOUT", "300")
    before = Residue.take(root)
    yield root
    subprocess.run([HPCVM, "down", "--all", "--timeout", "10"], capture_output=True)
    assert_nothing_left(before)


@pytest.fixture
def host_files() -> Iterator[dict[str, Path]]:
    """A secret in /root, an unshared directory, and two directories to share; the
    share directories are world-writable, so only ``:rw`` decides what the guest may
    write. Under /tmp (not pytest's 0700 tmp) so libvirt's QEMU can reach them."""
    secret = Path("/root") / f"hpcvm-isolation-{uuid.uuid4().hex}"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    base = Path(tempfile.mkdtemp(prefix="hpcvm-isolation-", dir="/tmp"))
    base.chmod(0o755)
    made = {"secret": secret, "unshared": base / "unshared", "ro": base / "ro", "rw": base / "rw"}
    for key in ("unshared", "ro", "rw"):
        made[key].mkdir()
        made[key].chmod(0o777)
        (made[key] / "file.txt").write_text(f"{key} file\n")
        (made[key] / "file.txt").chmod(0o666)
    try:
        yield made
    finally:
        secret.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def guest(name: str, script: str) -> subprocess.CompletedProcess[str]:
    return hpcvm("exec", name, "--", "/bin/sh", "-c", script, timeout=BOOT_TIMEOUT)


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


@pytest.mark.parametrize("backend", ["qemu", "libvirt"])
def test_guest_sees_only_its_shares(
    runtime: Path, host_files: dict[str, Path], backend: str, request: pytest.FixtureRequest
) -> None:
    extra = ["--backend", backend]
    if backend == "libvirt":
        extra += ["--connect", request.getfixturevalue("libvirtd")]
    ro, rw = host_files["ro"], host_files["rw"]
    up = hpcvm("up", "--name", "iso", *UP, *extra, "--share", str(ro), "--share", f"{rw}:rw",
               timeout=BOOT_TIMEOUT)  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert f"{ro} (ro)" in up.stdout + up.stderr and f"{rw} (rw)" in up.stdout + up.stderr
    machine = state.load_machine("iso")
    assert machine.pid is not None

    status = proc_status(machine.pid)
    uids = [int(u) for u in status["Uid"].split()]
    assert all(u != 0 for u in uids), status["Uid"]  # real, effective, saved, fs
    assert status["Seccomp"] == "2"

    # What must stay out of reach.
    secret, unshared = host_files["secret"], host_files["unshared"]
    for path in (secret, Path("/etc/shadow"), unshared / "file.txt"):
        assert path.exists()
        probe = guest("iso", f"cat {path}")
        assert probe.returncode != 0 and probe.stdout == "", f"{path}: {probe.stdout}"
    # Whatever is shared, QEMU's user cannot read a file only root may read: the guest
    # sees its name in a share but not its contents.
    root_only = ro / "root-only.txt"
    root_only.write_text("root only\n")
    root_only.chmod(0o600)
    direct = guest("iso", f"test -e {root_only} && cat {root_only}")
    assert direct.returncode != 0 and direct.stdout == ""
    assert "Permission denied" in direct.stderr, direct.stderr

    # What is shared, and where writes land.
    assert guest("iso", f"cat {ro}/file.txt").stdout == "ro file\n"
    assert guest("iso", f"cat {rw}/file.txt").stdout == "rw file\n"
    wrote_ro = guest("iso", f"echo from-guest > {ro}/new.txt && cat {ro}/new.txt")
    assert wrote_ro.stdout == "from-guest\n"  # the guest's overlay takes it...
    assert not (ro / "new.txt").exists()  # ...the host does not
    assert guest("iso", f"echo from-guest > {rw}/new.txt").returncode == 0
    assert (rw / "new.txt").read_text() == "from-guest\n"
    assert (rw / "new.txt").stat().st_uid == machine_uid(machine.pid)

    # verify's share checks, through the real agent.
    assert machine.boot.agent_socket is not None
    with GuestAgent(machine.boot.agent_socket, timeout=BOOT_TIMEOUT) as agent:
        checks = check_shares(machine, agent)
    assert [c.ok for c in checks] == [True, True], checks
    assert "/etc/shadow" in checks[0].expected

    image_owner = Path(str(machine.boot.kernel)).stat().st_uid
    down = hpcvm("down", "iso", timeout=BOOT_TIMEOUT)
    assert down.returncode == 0, down.stderr
    if backend == "libvirt":  # dynamic_ownership gave the kernel to QEMU's user...
        deadline = time.monotonic() + 30
        while Path(str(machine.boot.kernel)).stat().st_uid != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert Path(str(machine.boot.kernel)).stat().st_uid == 0  # ...and took it back
    else:
        assert image_owner == 0  # -runas: nothing is chowned


def machine_uid(pid: int) -> int:
    return int(proc_status(pid)["Uid"].split()[1])


@pytest.mark.parametrize(
    ("share", "words"),
    [
        ("relative/dir", "must be absolute"),
        ("/nonexistent-hpcvm-share", "does not exist"),
        ("/", "whole root"),
        ("{runtime_parent}", "runtime directory"),
    ],
)
def test_bad_share_is_refused_before_anything_starts(runtime: Path, share: str, words: str) -> None:
    spec = share.format(runtime_parent=runtime.parent)
    proc = hpcvm("up", "--name", "bad", *UP, "--share", spec)
    assert proc.returncode == 2, proc.stderr
    assert words in one_line_error(proc)
    assert not (runtime / "bad").exists()


def test_rw_share_qemu_cannot_write_is_refused(runtime: Path) -> None:
    closed = Path(tempfile.mkdtemp(prefix="hpcvm-isolation-closed-", dir="/tmp"))
    try:
        closed.chmod(0o755)  # root's: hpcvm-qemu may read it but not write it
        proc = hpcvm("up", "--name", "bad", *UP, "--share", f"{closed}:rw")
        assert proc.returncode == 2, proc.stderr
        assert "cannot write" in one_line_error(proc)
        assert not (runtime / "bad").exists()
    finally:
        os.rmdir(closed)


def test_hpc_guest_boots_with_its_plans_kernel_args(runtime: Path, hugepages: HugePages) -> None:
    """The guest's own /proc/cmdline holds every argument the hpc plan recommends."""
    hugepages.ensure_free(PAGE_2M, 256 * 1024 * 1024 // PAGE_2M)
    up = hpcvm("up", "--name", "hpcargs", "--profile", "hpc", "--vcpus", "1", "--memory",
               "256M", "--accel", "tcg", timeout=BOOT_TIMEOUT)  # fmt: skip
    assert up.returncode == 0, up.stderr
    wanted = state.load_machine("hpcargs").plan.guest_kernel_args
    assert wanted  # the planner recommends some for hpc
    cmdline = guest("hpcargs", "cat /proc/cmdline").stdout.split()
    assert set(wanted) <= set(cmdline), (wanted, cmdline)
    assert hpcvm("down", "hpcargs", timeout=BOOT_TIMEOUT).returncode == 0
