"""hpcvm's per-user runtime directory is checked as ssh-agent and tmux check theirs, a
control socket's path too long for the kernel is refused before anything starts, and
fixes only root can apply are worded for the admin when the process is not root.

Real directories, owners and modes (chown to ``nobody``: these tests run as root, and
skip otherwise); what a user who is not root meets is run in a child process that
dropped to ``nobody`` (fork, setgid, setuid), not simulated.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcvm.errors import UsageError
from hpcvm.host.privilege import for_admin
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.net import vf as net_vf
from tests.cluster_support import vm_count
from tests.users import Raised, in_child_as
from tests.users import open_dir as open_dir  # a fixture

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="chown and setuid: needs root")
NOBODY = pwd.getpwnam("nobody")


def as_nobody(func: Callable[[], str]) -> str:
    """``func()`` in a child process running as ``nobody``: its result, or the text of
    the UsageError it raised prefixed with "error: " (anything else: "unexpected ...")."""
    out = in_child_as(NOBODY.pw_uid, NOBODY.pw_gid, func)
    if isinstance(out, Raised):
        return f"error: {out.message}" if out.usage else f"unexpected {out.name}: {out.message}"
    return str(out)


def _owned_by_nobody(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(mode=mode)
    os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    return path


@needs_root
def test_another_users_runtime_dir_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _owned_by_nobody(tmp_path / "rt")
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    with pytest.raises(UsageError) as info:
        paths.runtime_root()
    message = info.value.message
    assert str(root) in message and "belongs to user nobody" in message
    assert paths.ENV_RUNTIME_DIR in message and "\n" not in message


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p.mkdir(mode=0o777) or p.chmod(0o777), "chmod go-w"),
        (lambda p: p.mkdir(mode=0o770) or p.chmod(0o770), "group- or world-writable"),
        (lambda p: p.write_text("x"), "not a directory"),
        (lambda p: p.symlink_to(p.parent), "symbolic link"),
    ],
    ids=["world-writable", "group-writable", "a file", "a symlink"],
)
def test_a_runtime_dir_others_could_reach_into_is_refused(
    make: Callable[[Path], object], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "rt"
    make(root)
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    with pytest.raises(UsageError) as info:
        paths.ensure_root()
    assert words in info.value.message and str(root) in info.value.message


def test_a_missing_runtime_dir_is_made_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "a" / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    assert paths.runtime_root() == root and not root.exists()  # asking makes nothing
    assert paths.ensure_root() == root
    assert root.stat().st_mode & 0o777 == 0o711 and root.stat().st_uid == os.geteuid()


@needs_root
def test_a_user_is_told_why_their_runtime_dir_cannot_be_made(open_dir: Path) -> None:
    root = open_dir / "rt"

    def ensure() -> str:
        os.environ[paths.ENV_RUNTIME_DIR] = str(root)
        return str(paths.ensure_root())

    message = as_nobody(ensure)
    assert message.startswith("error: ") and "cannot be made" in message, message
    assert f"{open_dir} is not writable by you" in message
    assert not root.exists()


@needs_root
def test_a_foreign_default_dir_names_the_admin_and_another_xdg_dir_is_not_used(
    open_dir: Path,
) -> None:
    """The default location (under XDG_RUNTIME_DIR) made by another user: the user
    cannot remove it, so the admin is asked. An XDG_RUNTIME_DIR that is not the user's
    own (a job inheriting the login node's) is not used at all."""
    xdg = _owned_by_nobody(open_dir / "xdg", 0o755)
    (xdg / "hpcvm").mkdir(mode=0o755)  # root's: not nobody's

    def where() -> str:
        os.environ.pop(paths.ENV_RUNTIME_DIR, None)
        os.environ["XDG_RUNTIME_DIR"] = str(xdg)
        return str(paths.runtime_root())

    message = as_nobody(where)
    assert "belongs to user root" in message and "ask your admin to remove it" in message

    def fallback() -> str:
        os.environ.pop(paths.ENV_RUNTIME_DIR, None)
        os.environ["XDG_RUNTIME_DIR"] = str(open_dir)  # root's
        return str(paths.runtime_location()[0])

    assert as_nobody(fallback) == f"/tmp/hpcvm-{NOBODY.pw_uid}"


def test_an_over_long_socket_path_is_refused_naming_length_limit_and_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / ("r" * max(1, 100 - len(str(tmp_path))))
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    with pytest.raises(UsageError) as info:
        paths.run_dir("vm1")
    longest = root / "vm1" / paths.AGENT_SOCKET
    message = info.value.message
    assert str(longest) in message and f"{len(str(longest))} bytes" in message
    assert "107" in message and "shorter" in message and paths.ENV_RUNTIME_DIR in message
    fits = "v" * (paths.SOCKET_PATH_MAX - len(f"{tmp_path}/") - len(f"/{paths.AGENT_SOCKET}"))
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path))
    assert len(str(paths.run_dir(fits) / paths.AGENT_SOCKET)) == paths.SOCKET_PATH_MAX


def test_up_with_an_over_long_socket_path_starts_nothing(tmp_path: Path) -> None:
    root = tmp_path / ("r" * 110)
    env = {**os.environ, paths.ENV_RUNTIME_DIR: str(root)}
    args = ["up", "--name", "vm1", "--profile", "naive", "--vcpus", "1", "--memory", "256M"]
    done = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("hpcvm: error: the VM's control socket") and "107" in line
    assert not root.exists()


@needs_root
def test_ps_refuses_another_users_runtime_dir_in_one_line(tmp_path: Path) -> None:
    root = _owned_by_nobody(tmp_path / "rt")
    env = {**os.environ, paths.ENV_RUNTIME_DIR: str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "ps"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "belongs to user nobody" in line and "Traceback" not in done.stderr


@needs_root
def test_a_fix_only_root_can_apply_is_worded_for_the_admin(open_dir: Path) -> None:
    """Root is told the command; anyone else to ask their admin. The VF case runs on a
    fake sysfs tree (a PCI device without physfn): no SR-IOV NIC exists here."""
    assert for_admin("run `libvirtd -d`") == "run `libvirtd -d`"
    assert (
        as_nobody(lambda: for_admin("run `libvirtd -d`")) == "ask your admin to run `libvirtd -d`"
    )
    device = open_dir / "bus" / "pci" / "devices" / "0000:01:00.2"
    device.mkdir(parents=True)

    def refusal() -> str:
        net_vf.VfKind(open_dir).virtual_function("0000:01:00.2")
        return "accepted"

    user_line = as_nobody(refusal)
    assert "ask your admin to create VFs (`echo N > /sys/bus/pci/devices/PF/sriov_numvfs`)" in (
        user_line
    )
    with pytest.raises(UsageError) as info:
        refusal()
    assert "ask your admin" not in info.value.message


@needs_root
def test_up_in_a_default_dir_another_user_made_first_is_refused_before_anything_starts() -> None:
    """Issue 38's hole: another user makes ``/tmp/hpcvm-<victim's uid>`` first, mode
    0777. The victim (a second uid, as a site's user: no XDG_RUNTIME_DIR, no
    HPCVM_RUNTIME_DIR) runs ``hpcvm up`` for real, in a child dropped to that uid: one
    line naming the directory and the fix (worded for the admin: only root can remove
    another's directory), exit code 2, nothing made in the directory, no QEMU."""
    victim = 2399
    premade = Path(tempfile.gettempdir()) / f"hpcvm-{victim}"
    shutil.rmtree(premade, ignore_errors=True)
    _owned_by_nobody(premade, 0o777)
    premade.chmod(0o777)
    name = f"sq{os.getpid()}"
    with tempfile.TemporaryFile("w+") as err:

        def up() -> int:
            for variable in (paths.ENV_RUNTIME_DIR, "XDG_RUNTIME_DIR"):
                os.environ.pop(variable, None)
            os.dup2(err.fileno(), 2)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            from hpcvm.cli.main import main

            argv = ["up", "--name", name, "--profile", "naive", "--vcpus", "1", "--memory", "256M"]
            return main(argv)

        try:
            code = in_child_as(victim, victim, up)
            err.seek(0)
            said = err.read()
            left = list(premade.iterdir())
        finally:
            shutil.rmtree(premade, ignore_errors=True)
    assert code == 2, said
    (line,) = said.strip().splitlines()
    assert line.startswith(f"hpcvm: error: hpcvm's runtime directory {premade} belongs to"), line
    assert "user nobody" in line and "ask your admin to remove it" in line, line
    assert paths.ENV_RUNTIME_DIR in line
    assert left == [] and vm_count(name) == 0
