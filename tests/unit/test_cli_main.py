"""The lazy command table must list exactly what the command modules register."""

from __future__ import annotations

import subprocess
import sys

from hpcvm.cli.main import COMMAND_MODULES, load_commands


def test_every_registered_command_is_in_the_table_and_back() -> None:
    registered: dict[str, str] = {}
    for module_name in set(COMMAND_MODULES.values()):
        for name in load_commands(module_name):
            registered[name] = module_name
    assert registered == COMMAND_MODULES


def test_help_lists_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in COMMAND_MODULES:
        assert f"  {name}" in out


def test_unknown_command_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "frobnicate"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "No such command" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_mac_addresses_print_as_they_are() -> None:
    """rich turns ":cd:" into an emoji by default; a MAC such as 0a:cd:0d:13:c4:18 (a
    real one of this machine's VMs) must print byte for byte."""
    from hpcvm.cli import common

    for console in (common.console, common.err_console):
        with console.capture() as captured:
            console.print("NIC 0a:cd:0d:13:c4:18", highlight=False)
        assert captured.get().strip() == "NIC 0a:cd:0d:13:c4:18"
