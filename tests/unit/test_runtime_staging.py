"""The built-in guest's read-only shares as one 9p export (runtime/hostside/staging.py).

The assembling script runs for real here (``unshare`` and ``mount`` as root), with a
shell standing in for QEMU: the oracles are what that shell sees in its namespace
(the host's own files through the export, the links, a read-only mount) and the host's
mount table below the test's directory, read before and after, which must not change.
The guest side (one overlay root, secrets absent) is tried by
tests/integration/test_isolation.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpcvm.bootspec import BootSpec, GuestLink, Share
from hpcvm.runtime.hostside import staging

ETC = Share(host_path="/etc", guest_path="/etc", tag="hpcvm1", hide=("shadow", "ssh/x_key"))
USR = Share(host_path="/usr", guest_path="/usr", tag="hpcvm0")
BIN = GuestLink(guest_path="/bin", target="usr/bin")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")


def _boot(*shares: Share, links: tuple[GuestLink, ...] = (BIN,)) -> BootSpec:
    return BootSpec(shares=shares, links=links, share_table=True)


def _mounts(under: Path) -> list[str]:
    """The host's mount points at or below ``under`` (the test's own directory, where
    every mount the staging makes lies): other tests and other processes on the machine
    mount and unmount elsewhere meanwhile (pytest-xdist's other workers among them)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    points = [line.split()[4] for line in lines]
    return sorted(p for p in points if p == str(under) or p.startswith(f"{under}/"))


@root_only
def test_the_list_becomes_one_export_with_the_secrets_hidden_below_their_share(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rw = Share(host_path=str(data), guest_path="/data", tag="hpcvm2", writable=True)
    staged = staging.stage(_boot(USR, ETC, rw), tmp_path)
    assert staged is not None
    root, *rest = staged.boot.shares
    assert (root.guest_path, root.tag, root.writable) == ("/", staging.STAGED_TAG, False)
    assert root.hide == ("etc/shadow", "etc/ssh/x_key")
    assert rest == [rw]  # a writable share stays a device of its own
    assert staged.boot.links == ()  # the links are in the tree
    assert Path(root.host_path) == tmp_path / staging.STAGE_DIR
    assert list(Path(root.host_path).iterdir()) == []


@root_only
def test_qemu_s_namespace_sees_the_shares_read_only_and_the_host_sees_nothing(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "input.txt").write_text("input\n")
    work = Share(host_path=str(mine), guest_path="/home/u/work", tag="hpcvm2")
    staged = staging.stage(_boot(USR, ETC, work), tmp_path)
    assert staged is not None
    where = staged.boot.shares[0].host_path
    before = _mounts(tmp_path)
    probe = (
        f"cat {where}/home/u/work/input.txt; readlink {where}/bin; "
        f"test -x {where}/usr/bin/env && echo env-there; "
        f"touch {where}/usr/hpcvm-probe 2>/dev/null || echo read-only"
    )
    done = subprocess.run(
        staging.wrap(["/bin/sh", "-c", probe], staged), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["input", "usr/bin", "env-there", "read-only"]
    assert _mounts(tmp_path) == before
    assert list(Path(where).iterdir()) == []  # removing the run directory is harmless


@root_only
def test_a_failing_mount_stops_before_qemu(tmp_path: Path) -> None:
    gone = Share(host_path=str(tmp_path / "missing"), guest_path="/x", tag="hpcvm2")
    staged = staging.stage(_boot(USR, gone), tmp_path)
    assert staged is not None
    done = subprocess.run(
        staging.wrap(["/bin/echo", "qemu-started"], staged), capture_output=True, text=True
    )
    assert done.returncode != 0 and "qemu-started" not in done.stdout


@pytest.mark.parametrize(
    "shares",
    [
        (USR, Share(host_path="/tmp", guest_path="/usr/local/x", tag="hpcvm2")),  # inside /usr
        (USR, Share(host_path="/tmp", guest_path="/bin/x", tag="hpcvm2")),  # under a link
        (
            USR,
            Share(host_path="/srv", guest_path="/data", tag="hpcvm2", writable=True),
            Share(host_path="/tmp", guest_path="/data/in", tag="hpcvm3"),  # inside an rw one
        ),
    ],
)
def test_a_share_inside_another_keeps_the_list(tmp_path: Path, shares: tuple[Share, ...]) -> None:
    assert staging.stage(_boot(*shares), tmp_path) is None
    assert not (tmp_path / staging.STAGE_DIR).exists()


def test_a_disk_image_keeps_its_shares(tmp_path: Path) -> None:
    boot = BootSpec(shares=(USR,), share_table=False)
    assert staging.stage(boot, tmp_path) is None
