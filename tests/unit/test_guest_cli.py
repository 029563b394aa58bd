"""`hpcvm guest build|info` through the real CLI entry point (exit codes, one-line
errors, nothing created on bad input)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcvm.cli.main import main
from tests.guest_support import unpacked_kernel


def test_build_with_missing_kernel_exits_2_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    code = main(["guest", "build", "--kernel", str(tmp_path / "nope"), "--cache-dir", str(cache)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "nope" in err
    assert not cache.exists()


def test_info_without_an_image_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kernel = unpacked_kernel().vmlinuz
    code = main(["guest", "info", "--kernel", str(kernel), "--cache-dir", str(tmp_path)])
    assert code == 1
    assert "hpcvm guest build" in capsys.readouterr().err


def test_build_prints_time_and_size_then_info_finds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel = str(unpacked_kernel().vmlinuz)
    common = ["--kernel", kernel, "--cache-dir", str(tmp_path), "--bzimage"]
    assert main(["guest", "build", *common]) == 0
    out = capsys.readouterr().out
    assert "built" in out and "build time" in out and "MiB" in out
    assert main(["guest", "build", *common, "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["cached"] is True and built["kernel_format"] == "bzimage"
    assert main(["guest", "info", *common, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs_hash"] == built["inputs_hash"]
