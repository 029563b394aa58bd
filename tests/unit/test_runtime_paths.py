"""Runtime directory location and VM name rules (runtime/hostside/paths.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcvm.errors import UsageError
from hpcvm.runtime.hostside import paths


def test_env_overrides_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "rt"))
    assert paths.runtime_root() == tmp_path / "rt"
    assert paths.run_dir("job1") == tmp_path / "rt" / "job1"


def test_default_root_depends_on_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(paths.ENV_RUNTIME_DIR, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    expected = Path("/run/hpcvm") if os.geteuid() == 0 else Path("/run/user/4242/hpcvm")
    assert paths.runtime_root() == expected


def test_ensure_root_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(tmp_path / "rt"))
    root = paths.ensure_root()
    assert root.stat().st_mode & 0o777 == 0o711  # searchable, not listable


@pytest.mark.parametrize("name", ["job1", "a", "run-12.x_y", "A" * 63])
def test_good_names(name: str) -> None:
    assert paths.check_name(name) == name


@pytest.mark.parametrize("name", ["", "../etc", "a/b", "a b", ".hidden", "-x", "A" * 64, "é"])
def test_bad_names_are_usage_errors(name: str) -> None:
    with pytest.raises(UsageError, match="invalid VM name"):
        paths.check_name(name)
