"""netguard.check_grant: a bridge NIC whose tap cannot be guarded is refused before
anything starts, in one line naming the admin's fix. Run as a real other uid (a forked
child, tests/users.py) against real files: a missing helper, one that is not setuid,
and the built one for root."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.errors import UsageError
from hpcvm.runtime.net import netguard
from tests.users import Raised, in_child_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setuid to other users: needs root")

USER = (2397, 2397)  # no account needed: the checks are on files


def _check_as(user: tuple[int, int], helper: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv(netguard.ENV, str(helper))
    return in_child_as(*user, lambda: netguard.check_grant("br0"))


def test_a_user_without_the_helper_is_refused_naming_the_admins_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _check_as(USER, tmp_path / "hpcvm-netguard", monkeypatch)
    assert isinstance(got, Raised) and got.usage and got.exit_code == 2, got
    assert "needs hpcvm-netguard" in got.message and "is missing" in got.message
    assert "scripts/install-node.sh --only netguard" in got.message
    assert "\n" not in got.message


@pytest.fixture
def readable() -> Iterator[Path]:
    """A directory of root's every user may look into (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="hpcvm-netguard-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_user_with_a_helper_that_is_not_setuid_root_is_refused(
    readable: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper = readable / "hpcvm-netguard"
    helper.write_bytes(b"#!/bin/false\n")
    helper.chmod(0o755)
    got = _check_as(USER, helper, monkeypatch)
    assert isinstance(got, Raised) and got.usage, got
    assert "setuid root" in got.message and str(helper) in got.message
    helper.chmod(0o4755)  # root's, setuid: granted
    assert _check_as(USER, helper, monkeypatch) is None


def test_root_needs_the_helper_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(netguard.ENV, str(tmp_path / "none"))
    with pytest.raises(UsageError, match=r"build it with `make all`"):
        netguard.check_grant("br0")
