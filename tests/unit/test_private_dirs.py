"""State no other user can take (issue 38): every directory hpcvm keeps per-user state,
locks, guest memory or checkpoints in passes one check (paths.dir_problem), and what
fails it is refused in one line naming the path and the fix.

Real directories, owners and modes (chown to ``nobody``), a real hugetlbfs mount, and
what another user can do tried for real by a child dropped to ``nobody``
(tests/users.py): the oracle is the kernel's errno, not hpcvm's answer. Needs root.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpcvm.cluster.job import state
from hpcvm.errors import UsageError
from hpcvm.runtime.checkpoint import directory as checkpoint_dir
from hpcvm.runtime.hostside import hugetlbfs, paths
from tests.users import in_child_as
from tests.users import open_dir as open_dir  # a fixture

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown and setuid: needs root")

NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def shared(open_dir: Path) -> Path:
    """A directory another user can reach (pytest's tmp_path is root's 0700)."""
    return open_dir


def nobodys(path: Path, mode: int) -> Path:
    path.mkdir()
    os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    path.chmod(mode)
    return path


def as_nobody_errno(act: Callable[[], object]) -> int:
    """The errno the kernel answers ``act()`` with, run as nobody (0: it succeeded)."""

    def work() -> int:
        try:
            act()
        except OSError as exc:
            return exc.errno or -1
        return 0

    return int(in_child_as(NOBODY.pw_uid, NOBODY.pw_gid, work))


def one_line(info: pytest.ExceptionInfo[UsageError], *words: str) -> str:
    message = info.value.message
    assert "\n" not in message and all(w in message for w in words), message
    return message


@pytest.mark.parametrize(
    ("mode", "owner", "owners", "sticky_ok", "kind"),
    [
        (0o700, 0, "me", False, None),
        (0o700, NOBODY.pw_uid, "me", False, "owner"),
        (0o777, 0, "me", False, "writable"),
        (0o1777, 0, "me", False, "writable"),
        (0o1777, 0, "me or root", True, None),
        (0o777, 0, "me or root", True, "writable"),
        (0o1777, NOBODY.pw_uid, "me or root", True, "owner"),
        (0o1777, NOBODY.pw_uid, "anyone", True, None),
        (0o2770, NOBODY.pw_uid, "anyone", True, "writable"),
    ],
)
def test_one_check_for_every_directory(
    shared: Path, mode: int, owner: int, owners: paths.Owners, sticky_ok: bool, kind: str | None
) -> None:
    path = shared / "d"
    path.mkdir()
    os.chown(path, owner, owner)
    path.chmod(mode)
    problem = paths.dir_problem(path, owners=owners, sticky_ok=sticky_ok)
    assert (problem.kind if problem else None) == kind
    link = shared / "link"
    link.symlink_to(path)
    problem = paths.dir_problem(link, owners=owners, sticky_ok=sticky_ok)
    assert problem is not None and problem.text == "is a symbolic link"  # never followed


def test_a_checkpoint_into_a_directory_others_may_write_is_refused(shared: Path) -> None:
    """Group- or world-writable without the sticky bit: another user could rename the
    checkpoint's directory and put their own files in its place. Nothing is written."""
    for mode in (0o777, 0o775):
        parent = nobodys(shared / f"open{mode:o}", mode)
        with pytest.raises(UsageError) as info:
            checkpoint_dir.check_target(parent / "ckpt")
        one_line(info, str(parent), f"mode {mode:04o}", "sticky one such as /tmp")
        with pytest.raises(UsageError), checkpoint_dir.writing(parent / "ckpt"):
            pass
        assert list(parent.iterdir()) == []


def test_a_checkpoint_in_a_sticky_directory_is_private_to_its_user(shared: Path) -> None:
    """Into a sticky 1777 directory (as /tmp): a fresh 0700 directory of 0600 files
    that another user can neither read, rename, remove nor replace."""
    parent = shared / "sticky"
    parent.mkdir()
    parent.chmod(0o1777)
    target = parent / "ckpt"
    with checkpoint_dir.writing(target) as writer:
        writer.write_text("plan.json", "the guest's memory stands in here")
        checkpoint_dir.commit_directory(writer.partial, "manifest.json", "{}", target)
    assert target.stat().st_mode & 0o7777 == 0o700
    assert {(p.name, p.stat().st_mode & 0o777) for p in target.iterdir()} == {
        ("plan.json", 0o600),
        ("manifest.json", 0o600),
    }
    decoy = parent / "decoy"
    in_child_as(NOBODY.pw_uid, NOBODY.pw_gid, lambda: decoy.mkdir())
    assert as_nobody_errno(lambda: (target / "plan.json").read_bytes()) == errno.EACCES
    assert as_nobody_errno(lambda: target.rename(parent / "moved")) == errno.EPERM
    assert as_nobody_errno(lambda: decoy.rename(target)) == errno.EPERM
    assert as_nobody_errno(lambda: shutil.rmtree(target)) == errno.EACCES
    assert (target / "plan.json").read_text() == "the guest's memory stands in here"


def test_a_checkpoint_others_could_change_is_not_restored(shared: Path) -> None:
    """Before anything is read: a checkpoint directory of another user, one that others
    may write, or one in a directory others may write without the sticky bit."""
    theirs = nobodys(shared / "theirs", 0o755)
    with pytest.raises(UsageError) as info:
        checkpoint_dir.load(theirs)
    one_line(info, f"checkpoint {theirs} belongs to user nobody", "checkpoint of yours")
    open_ckpt = shared / "open"
    open_ckpt.mkdir()
    open_ckpt.chmod(0o777)
    with pytest.raises(UsageError) as info:
        checkpoint_dir.load(open_ckpt)
    one_line(info, "group- or world-writable (mode 0777)", f"chmod go-w {open_ckpt}")
    parent = nobodys(shared / "swappable", 0o777)
    inside = parent / "ckpt"
    inside.mkdir(mode=0o700)
    with pytest.raises(UsageError) as info:
        checkpoint_dir.load(inside)
    one_line(info, str(parent), "could swap the checkpoint's files")


def test_a_cluster_state_directory_others_could_reach_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's state (its ssh key, its record) and the locks of ``cluster up`` and
    ``down`` live in <runtime root>/.clusters: checked as the root is, in one line."""
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "rt"))
    made = state.clusters_dir()
    assert made.stat().st_mode & 0o777 == 0o700
    made.chmod(0o770)
    with pytest.raises(UsageError) as info:
        state.one_writer("job1").__enter__()
    one_line(info, f"cluster state directory {made} is group- or world-writable", "rm -r")
    made.rmdir()
    made.symlink_to(tmp_path)
    with pytest.raises(UsageError) as info, state.claimed("job1"):
        pass
    one_line(info, f"{made} is a symbolic link")
    assert not (tmp_path / "job1").exists()


@pytest.fixture
def hugetlbfs_mount(shared: Path) -> Iterator[Path]:
    """A real hugetlbfs mount made here (root), world-writable without the sticky bit."""
    mount = shared / "huge"
    mount.mkdir()
    size = hugetlbfs.default_page_size()
    options = f"pagesize={size // 1024}K,mode=0777"
    done = subprocess.run(
        ["mount", "-t", "hugetlbfs", "-o", options, "none", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount hugetlbfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, check=False)


def test_a_hugetlbfs_mount_others_may_swap_files_in_is_refused(hugetlbfs_mount: Path) -> None:
    size = hugetlbfs.default_page_size()
    with pytest.raises(UsageError) as info:
        hugetlbfs.ensure_mount(str(hugetlbfs_mount), size)
    one_line(info, f"hugetlbfs mount {hugetlbfs_mount}", "without the sticky bit", "mode=1770")
    hugetlbfs_mount.chmod(0o1777)  # the mount's root, as mode=1777 would have made it
    hugetlbfs.ensure_mount(str(hugetlbfs_mount), size)  # sticky, as the node install's
    vm_dir = hugetlbfs.make_vm_dir(str(hugetlbfs_mount), "vm1", Path("/run/x"))
    assert vm_dir.stat().st_mode & 0o777 == 0o700
    assert as_nobody_errno(lambda: vm_dir.rename(hugetlbfs_mount / "moved")) == errno.EPERM
    hugetlbfs.remove_vm_dir(vm_dir)
    assert not vm_dir.exists()
