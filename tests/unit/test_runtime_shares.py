"""The share list (runtime/hostside/shares.py) and who QEMU runs as
(runtime/hostside/confine.py), on real
directories: --share parsing and its refusals, /etc's secrets, the built-in list, and
access asked of the kernel as another user."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hpcvm.bootspec import BootSpec, share_table
from hpcvm.errors import UsageError
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.hostside import shares as sh
from hpcvm.runtime.hostside.confine import QEMU_USER, can_access, qemu_user, user_by_ids

ROOT = os.geteuid() == 0


@pytest.fixture(autouse=True)
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    return root


def test_share_forms(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    assert sh.parse_share(str(data)) == sh.ShareRequest(str(data), str(data), False)
    assert sh.parse_share(f"{data}:rw") == sh.ShareRequest(str(data), str(data), True)
    assert sh.parse_share(f"{data}:ro") == sh.ShareRequest(str(data), str(data), False)
    assert sh.parse_share(f"{data}:/in/guest/") == sh.ShareRequest(str(data), "/in/guest")
    assert sh.parse_share(f"{data}:/g:rw") == sh.ShareRequest(str(data), "/g", True)
    link = tmp_path / "link"
    link.symlink_to(data)
    assert sh.parse_share(str(link)) == sh.ShareRequest(str(data), str(link), False)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("relative/dir", "must be absolute"),
        ("{tmp}/missing", "does not exist"),
        ("{tmp}/file", "not a directory"),
        ("/", "whole root"),
        ("{tmp}", "runtime directory"),
        ("{tmp}/data:relative", "must be absolute"),
        ("{tmp}/data:/proc/x", "guest's own"),
        ("{tmp}/data:/", "cannot be /"),
        ("{tmp}/data:/a:/b", "HOST_DIR"),
        ("{tmp}/da\nta", "newline"),
    ],
)
def test_bad_share_is_a_one_line_usage_error(spec: str, words: str, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError) as info:
        sh.parse_share(spec.format(tmp=tmp_path))
    assert words in info.value.message
    assert "\n" not in info.value.message.replace(spec.format(tmp=tmp_path), "")


@pytest.mark.skipif(not ROOT, reason="mounts a read-only tmpfs: needs root")
def test_rw_share_on_a_read_only_file_system_is_refused(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1M", "hpcvm-test", str(ro)])
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(UsageError, match="read-only file system"):
            sh.parse_share(f"{ro}:rw")
        assert sh.parse_share(str(ro)).host_path == str(ro)  # read-only is fine
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_two_shares_at_one_guest_path_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(UsageError, match="both shared at /x"):
        sh.parse_shares([f"{tmp_path}/a:/x", f"{tmp_path}/b:/x"])


def test_etc_secrets_are_hidden(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "ssh").mkdir(parents=True)
    (etc / "sudoers.d").mkdir()
    (etc / "private").mkdir(mode=0o700)
    (etc / "private" / "inside").write_text("x")
    files = {
        "passwd": 0o644,
        "shadow": 0o644,  # hidden by name even if someone made it readable
        "ssh/ssh_host_ed25519_key": 0o600,
        "ssh/ssh_host_ed25519_key.pub": 0o644,
        "ssh/ssh_host_rsa_key": 0o644,
        "secret.conf": 0o640,
        "sudoers.d/README": 0o644,
    }
    for name, mode in files.items():
        (etc / name).write_text(name)
        (etc / name).chmod(mode)
    (etc / "private").chmod(0o700)
    (etc / "link").symlink_to("secret.conf")
    hidden = set(sh.etc_hidden(str(etc)))
    assert hidden == {
        "shadow",
        "ssh/ssh_host_ed25519_key",
        "ssh/ssh_host_rsa_key",
        "secret.conf",
        "sudoers.d",
        "private",
    }


def test_host_etc_hides_what_others_cannot_read() -> None:
    """Oracle: the mode bits of the host's own /etc, walked here independently."""
    hidden = set(sh.etc_hidden("/etc"))
    for name in ("shadow", "gshadow"):
        if os.path.exists(f"/etc/{name}"):
            assert name in hidden
    for entry in Path("/etc").iterdir():
        if entry.is_symlink():
            continue
        mode = entry.lstat().st_mode
        need = 0o005 if stat.S_ISDIR(mode) else 0o004
        if mode & need != need:
            assert entry.name in hidden, entry
    assert "passwd" not in hidden and "hostname" not in hidden


def test_builtin_list_has_the_system_dirs_the_workdir_and_helpers(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    user = (sh.ShareRequest(str(tmp_path), "/data", True),)
    requests, links = sh.builtin_requests(user, str(work), warn=None)
    guest = {r.guest_path: r for r in requests}
    for path in sh.SYSTEM_DIRS:
        if os.path.islink(path):
            assert any(
                link.guest_path == path and link.target == os.readlink(path) for link in links
            )
        elif os.path.isdir(path):
            assert not guest[path].writable
    assert guest[str(work)].origin == "working directory" and not guest[str(work)].writable
    assert guest[str(sh.helpers_dir())].origin == "hpcvm helpers"
    assert guest["/data"].writable
    for absent in ("/", "/root", "/home", "/var", "/run", "/srv", "/proc", "/tmp"):
        assert absent not in guest


@pytest.mark.parametrize("where", ["/", "{runtime_parent}"])
def test_workdir_that_would_expose_too_much_is_not_shared(
    where: str, runtime: Path, tmp_path: Path
) -> None:
    warnings: list[str] = []
    workdir = where.format(runtime_parent=tmp_path)
    requests, _ = sh.builtin_requests((), workdir, warn=warnings.append)
    assert all(r.origin != "working directory" for r in requests)
    assert len(warnings) == 1 and "not shared" in warnings[0]


def test_workdir_inside_a_system_dir_is_not_shared_twice() -> None:
    requests, _ = sh.builtin_requests((), "/usr/share", warn=None)
    assert [r.guest_path for r in requests].count("/usr") == 1
    assert "/usr/share" not in [r.guest_path for r in requests]


def test_share_list_tags_and_hides_only_etc(tmp_path: Path) -> None:
    requests, links = sh.builtin_requests((), None, warn=None)
    listed = sh.share_list(requests, links)
    assert [s.tag for s in listed.shares] == [f"hpcvm{i}" for i in range(len(requests))]
    assert all(len(s.tag) < 32 for s in listed.shares)  # 9p's mount_tag limit
    etc = next(s for s in listed.shares if s.guest_path == "/etc")
    assert "shadow" in etc.hide
    assert all(not s.hide for s in listed.shares if s.guest_path != "/etc")
    table = share_table(BootSpec(shares=listed.shares, links=listed.links))
    assert "ro" in table.split() and "hide" in table.split()


@pytest.mark.skipif(not ROOT, reason="asks the kernel as another user: needs root")
def test_access_is_asked_as_the_qemu_user(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    user = user_by_ids(nobody.pw_uid, nobody.pw_gid, switch=True)
    tmp_path.chmod(0o755)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    inner = private / "open"
    inner.mkdir(mode=0o755)
    public = tmp_path / "public"
    public.mkdir(mode=0o755)
    writable = tmp_path / "writable"
    writable.mkdir()
    writable.chmod(0o777)
    parents = [p for p in tmp_path.parents if p != Path("/")]
    reachable_parents = all(p.stat().st_mode & 0o001 for p in parents)
    assert not can_access(str(private), user, write=False, opened_by_root=False)
    assert not can_access(str(inner), user, write=False, opened_by_root=False)
    # -runas: QEMU holds the directory open, so the 0700 parent does not matter
    assert can_access(str(inner), user, write=False, opened_by_root=True)
    assert can_access(str(public), user, write=False, opened_by_root=True)
    assert not can_access(str(public), user, write=True, opened_by_root=True)
    assert can_access(str(writable), user, write=True, opened_by_root=True)
    if reachable_parents:
        assert can_access(str(public), user, write=False, opened_by_root=False)


@pytest.mark.skipif(not ROOT, reason="asks the kernel as another user: needs root")
def test_unreachable_share_is_refused_and_workdir_left_out(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    user = user_by_ids(nobody.pw_uid, nobody.pw_gid, switch=True)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    request = sh.ShareRequest(str(closed), str(closed), True)
    with pytest.raises(UsageError, match="cannot write") as info:
        sh.reachable([request], user, opened_by_root=True)
    assert "setfacl" in info.value.message and "\n" not in info.value.message
    warnings: list[str] = []
    auto = sh.ShareRequest(str(closed), str(closed), origin="working directory")
    assert sh.reachable([auto], user, opened_by_root=True, warn=warnings.append) == []
    assert len(warnings) == 1


@pytest.mark.skipif(not ROOT, reason="hpcvm as root: QEMU drops to hpcvm-qemu")
def test_qemu_user_is_never_root() -> None:
    try:
        pwd.getpwnam(QEMU_USER)
    except KeyError:
        with pytest.raises(UsageError, match=r"setup\.sh"):
            qemu_user()
        return
    user = qemu_user()
    assert user.name == QEMU_USER and user.uid != 0 and user.switch


def test_preview_lists_what_up_would_share(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    lines = sh.preview([f"{data}:/data:rw"], workdir=str(tmp_path / "data"))
    assert f"/data <- {data} (rw)" in lines
    assert any(line.startswith("/etc (ro, ") and "hidden" in line for line in lines)
    assert "/usr (ro)" in lines
    with pytest.raises(UsageError):
        sh.preview(["relative"])


# -- the working directory: a job's directory, never a whole tree of the host ----------


def _home_of_someone() -> str:
    """A home directory from the password database that exists (root's, at least)."""
    homes = [
        e.pw_dir for e in pwd.getpwall() if e.pw_dir not in ("/", "") and os.path.isdir(e.pw_dir)
    ]
    return sorted(homes, key=lambda h: (h != "/root", h))[0]


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("/tmp", "world-writable"),
        ("/var/tmp", "world-writable"),
        ("/dev/shm", "the guest's own"),
        ("/var", "a top-level directory"),
        ("/home", "a top-level directory"),
        ("/srv", "a top-level directory"),
        ("/proc/self", "the guest's own"),
        ("{home}", "a home directory"),
        ("{sticky}", "world-writable"),
    ],
)
def test_workdir_that_is_a_whole_tree_or_shared_scratch_is_not_shared(
    where: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the README promises a guest does not see (/var, /home, /tmp, /srv, /root)
    stays out even when hpcvm runs from there; the warning says why and how to share
    it anyway."""
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, "/run/hpcvm-unit-test")  # not under /tmp
    sticky = tmp_path / "scratch"
    sticky.mkdir()
    sticky.chmod(0o1777)  # a shared scratch directory, like /tmp
    workdir = where.format(home=_home_of_someone(), sticky=sticky)
    if not os.path.isdir(workdir):
        pytest.skip(f"{workdir} does not exist here")
    real = os.path.realpath(workdir)
    warnings: list[str] = []
    requests, _ = sh.builtin_requests((), workdir, warn=warnings.append)
    assert all(r.origin != "working directory" for r in requests)
    assert real not in [r.host_path for r in requests]
    assert len(warnings) == 1, warnings
    assert why in warnings[0] and f"--share {real}" in warnings[0]


def test_a_job_directory_below_them_is_shared(tmp_path: Path) -> None:
    """The rule is about whole trees: a directory of one's own inside /tmp or a home
    directory is the job's directory and is shared as before."""
    job = Path(tempfile.mkdtemp(prefix="hpcvm-job-", dir="/tmp"))
    try:
        job.chmod(0o755)
        requests, _ = sh.builtin_requests((), str(job), warn=None)
        assert any(r.host_path == str(job) and r.origin == "working directory" for r in requests)
    finally:
        job.rmdir()


def test_an_explicit_share_of_tmp_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, "/run/hpcvm-unit-test")  # not under /tmp
    (request,) = sh.parse_shares(["/tmp"])
    requests, _ = sh.builtin_requests((request,), "/tmp", warn=None)
    assert [r.origin for r in requests if r.host_path == "/tmp"] == ["--share"]


def test_cluster_up_refuses_a_job_directory_the_guests_would_not_see(tmp_path: Path) -> None:
    """cluster exec runs in the job's directory inside the guests: from /tmp it would
    not be there, so cluster up refuses before Slurm is asked (no allocation here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env[paths.ENV_RUNTIME_DIR] = str(tmp_path / "rt")
    args = ["cluster", "up", "--name", "c", "--profile", "naive", "--vcpus", "1",
            "--memory", "256M", "--address", "10.9.0.1/24"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", *args],
        cwd="/tmp", env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "/tmp" in line and "--share /tmp" in line
    assert not (tmp_path / "rt").exists()
