"""The CLI's last resort: an OSError no command turned into an HpcvmError, and click's
own usage errors, each end as one ``hpcvm: error:`` line with a documented exit code
(README "Exit codes": 2), never a traceback. And ``guest info`` finds the image where
``guest build`` took it from: the site's cache first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import hpcvm.cli.main as cli_main
from hpcvm.cli.main import OS_ERROR_EXIT, main, os_error_message
from hpcvm.guest import image as guest_image
from tests.guest_support import unpacked_kernel


def test_an_escaping_os_error_is_one_line_naming_the_path(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Raised where main's try begins (plugin loading reads files too); a real error
    from the kernel, not a made-up one."""
    missing = tmp_path / "gone" / "plugin.toml"

    def load() -> None:
        missing.read_text()

    monkeypatch.setattr(cli_main, "load_plugins", load)
    assert main(["ps"]) == OS_ERROR_EXIT == 2
    err = capsys.readouterr().err
    fix = "No such file or directory: check the path and its permissions"
    assert err == f"hpcvm: error: {missing}: {fix}\n"


def test_an_os_error_without_a_path_still_says_what_happened() -> None:
    assert os_error_message(PermissionError(13, "Permission denied")).startswith(
        "Permission denied: "
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["frobnicate"], "No such command 'frobnicate': see `hpcvm --help`"),
        (["up", "--vcpus", "x"], "'x' is not a valid integer: see `hpcvm up --help`"),
        (["exec"], "Missing argument 'NAME': see `hpcvm exec --help`"),
    ],
)
def test_click_usage_errors_are_one_line(argv: list[str], words: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", *argv],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("hpcvm: error: ") and words in line


def test_guest_info_finds_the_sites_image_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The site's cache is a module constant (/var/cache/hpcvm/guest); here it points
    at a directory of the test's, where the image is really built."""
    site = tmp_path / "site"
    monkeypatch.setattr(guest_image, "SYSTEM_CACHE", site)
    kernel = unpacked_kernel().vmlinuz
    built = guest_image.build_guest(kernel=kernel, cache_dir=site, pvh=False)
    mine = tmp_path / "mine"
    found = guest_image.cached_guest(kernel=kernel, cache_dir=mine, pvh=False)
    assert found is not None and found.inputs_hash == built.inputs_hash
    assert found.initrd.is_relative_to(site) and not mine.exists()
