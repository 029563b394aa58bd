"""The grant a user needs for a tap in a bridge (runtime/net/bridge_helper.py): QEMU's
setuid bridge helper and its ACL. The ACL rules are QEMU's own (qemu-bridge-helper.c:
allow/deny NAME or all, deny wins, include FILE); a helper that is missing or not setuid
root is refused before anything starts, naming the admin's fix. The real helper runs in
tests/integration/test_unprivileged.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpcvm.errors import UsageError
from hpcvm.runtime.net import bridge_helper


@pytest.mark.parametrize(
    ("text", "bridge", "allowed"),
    [
        ("allow br0\n", "br0", True),
        ("allow br0\n", "br1", False),
        ("allow all\n", "brX", True),
        ("allow all\ndeny br1\n", "br1", False),
        ("deny all\nallow br0\n", "br0", False),  # deny wins, whatever the order
        ("# comment\n\n", "br0", False),
    ],
)
def test_acl_rules_are_qemus(tmp_path: Path, text: str, bridge: str, allowed: bool) -> None:
    acl = tmp_path / "bridge.conf"
    acl.write_text(text)
    assert bridge_helper.acl_allows(bridge, acl) is allowed


def test_acl_include_and_missing_file(tmp_path: Path) -> None:
    extra = tmp_path / "more.conf"
    extra.write_text("allow br7\n")
    acl = tmp_path / "bridge.conf"
    acl.write_text(f"include {extra}\n")
    assert bridge_helper.acl_allows("br7", acl) is True
    assert bridge_helper.acl_allows("br0", tmp_path / "none.conf") is False


def test_a_helper_that_is_not_setuid_root_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "qemu-bridge-helper"
    shutil.copy("/bin/true", copy)
    monkeypatch.setattr(bridge_helper, "HELPER", copy)
    with pytest.raises(UsageError) as info:
        bridge_helper.check_grant("br0")
    text = str(info.value)
    assert "not" in text and "dpkg-statoverride" in text and "allow br0" in text
    assert "\n" not in text
    monkeypatch.setattr(bridge_helper, "HELPER", tmp_path / "missing")
    with pytest.raises(UsageError, match="missing"):
        bridge_helper.check_grant("br0")
