"""What a user who is not root reads when a path is out of reach or a fix is root's.

On Python 3.11 ``Path.exists``/``is_dir``/``is_file`` raise PermissionError for a path
under a directory the user may not enter; each check below stats the path itself and
refuses in one line naming the option and the fix (a UsageError, exit 2), not the CLI's
last resort. Fixes only root can apply (load a module, install a package, join a group)
are worded for the admin when the process is not root.

Real directories and modes; the user is a child process dropped to ``nobody``
(tests/users.py, through test_runtime_root.py's ``as_nobody``), not simulated. What
cannot exist here is named by a path that does not exist (a host without /dev/net/tun, qemu-ga or
busybox) or stands in for it (a directory as /dev/kvm: it opens for no one).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcvm.cluster.job import checkpoint_model
from hpcvm.errors import HpcvmError
from hpcvm.guest import disk, hosttools
from hpcvm.host import kvm
from hpcvm.runtime.checkpoint import directory as checkpoint_dir
from hpcvm.runtime.checkpoint import model as vm_checkpoint
from hpcvm.runtime.net import bridge as net_bridge
from hpcvm.runtime.net.base import NetworkRequest
from hpcvm.runtime.vm import boot
from tests.unit.test_runtime_root import as_nobody, needs_root
from tests.users import open_dir

__all__ = ["open_dir"]  # the fixture, used here by name

pytestmark = needs_root
DENIED = f"cannot be reached ({os.strerror(errno.EACCES)})"  # as the system says it


def said(call: Callable[[], object]) -> Callable[[], str]:
    """``call`` as a function of no arguments giving its refusal's text ("error: ..."
    with the exit code), or "accepted"."""

    def run() -> str:
        try:
            call()
        except HpcvmError as exc:
            return f"error {exc.exit_code}: {exc}"
        return "accepted"

    return run


@pytest.fixture
def closed(open_dir: Path) -> Path:
    """A directory of root's, 0700: nobody may not enter it, so nothing under it can
    be looked at."""
    path = open_dir / "closed"
    path.mkdir(mode=0o700)
    return path


# -- unreachable paths ------------------------------------------------------------------


def test_an_unreachable_kernel_or_initrd_is_refused_naming_its_option(
    open_dir: Path, closed: Path
) -> None:
    kernel = open_dir / "vmlinuz"
    kernel.write_bytes(b"a file is all the check asks of it")
    kernel.chmod(0o644)
    line = as_nobody(said(lambda: boot.resolve_boot_media(kernel=str(closed / "vmlinuz"))))
    assert line.startswith("error 2: kernel ") and DENIED in line, line
    assert "give --kernel a file you may read" in line, line
    line = as_nobody(
        said(lambda: boot.resolve_boot_media(kernel=str(kernel), initrd=str(closed / "initrd")))
    )
    assert line.startswith("error 2: initrd ") and DENIED in line, line
    assert "give --initrd a file you may read" in line, line
    # What is plainly not there is still said as such.
    line = said(lambda: boot.resolve_boot_media(kernel=str(open_dir / "none")))()
    assert "does not exist or is not a file: check --kernel" in line, line


def test_an_unreachable_image_is_refused_naming_its_option(open_dir: Path, closed: Path) -> None:
    line = as_nobody(said(lambda: disk.check_image(closed / "disk.qcow2")))
    assert line.startswith("error 2: disk image ") and DENIED in line, line
    assert "give --image an image file you may read" in line, line
    line = said(lambda: disk.check_image(open_dir / "none.qcow2"))()
    assert "does not exist: check --image" in line, line


def test_an_unreachable_checkpoint_or_target_is_refused(open_dir: Path, closed: Path) -> None:
    line = as_nobody(said(lambda: checkpoint_dir.load(closed / "ckpt")))
    assert line.startswith(f"error 2: no checkpoint at {closed / 'ckpt'}: it {DENIED}"), line
    assert "give a checkpoint directory you may read" in line, line
    line = as_nobody(said(lambda: checkpoint_dir.check_target(closed / "new")))
    assert line.startswith(f"error 2: {closed / 'new'} {DENIED}"), line
    assert "give the checkpoint a new directory in one you may write" in line, line
    assert not (closed / "new").exists()
    line = said(lambda: checkpoint_dir.load(open_dir / "none"))()
    assert line.endswith("it does not exist"), line


def test_an_unreachable_job_checkpoint_is_refused_naming_restore(
    open_dir: Path, closed: Path
) -> None:
    line = as_nobody(said(lambda: checkpoint_model.read(closed / "job")))
    assert line.startswith(f"error 2: job checkpoint {closed / 'job'} {DENIED}"), line
    assert "give --restore a job checkpoint you may read" in line, line
    line = said(lambda: checkpoint_model.read(open_dir / "none"))()
    assert "(no such directory)" in line, line


def test_another_users_private_checkpoint_files_are_refused_in_one_line(open_dir: Path) -> None:
    """A checkpoint's files are private to whoever saved it: another user reaching the
    directory is refused as it is not theirs (checkpoint_dir.load) before any file is
    read, and a job checkpoint's manifest cannot be read."""
    for name, manifest in (("vm", vm_checkpoint.MANIFEST), ("job", checkpoint_model.MANIFEST)):
        (open_dir / name).mkdir(mode=0o755)
        (open_dir / name / manifest).write_text("{}")
        (open_dir / name / manifest).chmod(0o600)
    line = as_nobody(said(lambda: checkpoint_dir.load(open_dir / "vm")))
    assert line.startswith(
        f"error 2: checkpoint {open_dir / 'vm'} belongs to user root, not to you (user nobody)"
    ), line
    line = as_nobody(said(lambda: checkpoint_model.read(open_dir / "job")))
    assert line.startswith(f"error 2: job checkpoint {open_dir / 'job'}: job.json cannot be read")
    assert "give --restore a job checkpoint you may read" in line, line


# -- fixes only root can apply ----------------------------------------------------------


def _root_and_user(call: Callable[[], object]) -> tuple[str, str]:
    """The refusal as root and as ``nobody``."""
    return said(call)(), as_nobody(said(call))


def test_loading_tun_and_making_a_bridge_are_asked_of_the_admin(open_dir: Path) -> None:
    root, user = _root_and_user(lambda: net_bridge.check_tun(open_dir / "tun"))
    assert root.endswith("does not exist: load the tun module (`modprobe tun`)"), root
    assert user.endswith("does not exist: ask your admin to load the tun module (`modprobe tun`)")
    request = NetworkRequest(kind="bridge", source="hpcvmnobr9")  # no such link here

    def resolve() -> object:
        return net_bridge.BridgeKind().resolve(
            request, vm="v", index=0, address=None, warn=lambda text: None
        )

    root, user = _root_and_user(resolve)
    assert ": create it (`ip link add hpcvmnobr9 type bridge`) or name another" in root, root
    assert ": ask your admin to create it (`ip link add hpcvmnobr9" in user, user


def test_installing_the_guests_host_tools_is_asked_of_the_admin(open_dir: Path) -> None:
    root, user = _root_and_user(lambda: hosttools.qemu_ga(open_dir / "qemu-ga"))
    assert root.endswith("not found: install qemu-guest-agent (`apt-get install qemu-guest-agent`)")
    assert user.endswith("not found: ask your admin to install qemu-guest-agent (`apt-get "
                         "install qemu-guest-agent`)"), user  # fmt: skip
    assert user.startswith("error 5: "), user  # RuntimeFailure, as before
    root, user = _root_and_user(lambda: hosttools.busybox([str(open_dir / "busybox")]))
    assert root.endswith("busybox not found: install busybox-static (`apt-get install "
                         "busybox-static`)"), root  # fmt: skip
    assert "busybox not found: ask your admin to install busybox-static" in user, user
    dynamic = shutil.which("ls")  # a dynamically linked program, where a static one goes
    assert dynamic is not None
    root, user = _root_and_user(lambda: hosttools.busybox([dynamic]))
    assert "is dynamically linked" in root and "needs a static busybox: install" in root, root
    assert "needs a static busybox: ask your admin to install busybox-static" in user, user


def test_joining_the_kvm_group_is_asked_of_the_admin(open_dir: Path) -> None:
    """A directory stands in for /dev/kvm: it exists and opens read-write for no one,
    root included, as /dev/kvm does not for a user outside the kvm group."""

    def reason() -> str:
        return kvm.live_kvm(frozenset({"vmx"}), dev=open_dir, sys_root=open_dir).reason

    root, user = reason(), as_nobody(reason)
    assert "cannot be opened by this user: add this user to the kvm group" in root, root
    assert "cannot be opened by this user: ask your admin to add this user to the kvm" in user
    assert "run as root" not in user, user
