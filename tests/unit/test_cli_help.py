"""``--help`` stays fast because it imports little: the command list comes from
cli/main.py's table, each command's help from its own module alone, and none of them
pulls in pydantic models, scipy, numpy, matplotlib or rich. Checked on ``sys.modules`` of a
fresh interpreter (a timing would be flaky on a shared machine; benchmarks/cli_help.py
measures the time)."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from hpcvm.bench.run.choices import BUILTIN_SUITES, registered_suite_names
from hpcvm.cli.main import COMMANDS, cli, load_commands

HEAVY = ("pydantic", "scipy", "numpy", "matplotlib", "rich")  # rich: cli/common.py

ALSO_IMPORTS: dict[str, set[str]] = {}  # cluster up shares cli/vm_options.py with up

_PROBE = """
import json, sys
from hpcvm.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(*argv: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def _command_modules(modules: set[str]) -> set[str]:
    return {m.removeprefix("hpcvm.cli.") for m in modules if m.startswith("hpcvm.cli.")} & {
        c.module for c in COMMANDS.values()
    }


def test_top_level_help_imports_no_command_module() -> None:
    modules = _modules_after("--help")
    assert not _command_modules(modules)
    assert not _heavy(modules)


def test_looking_for_plugins_imports_no_metadata_reader_when_none_is_installed() -> None:
    """importlib.metadata took half of ``--version`` (plugins.py): it is imported only
    when a distribution names the plugin group, which none in this environment does."""
    from hpcvm.plugins import _group_declared

    assert not _group_declared(), "a distribution here declares hpcvm.plugins"
    for argv in (("--version",), ("--help",), ("up", "--help")):
        assert "importlib.metadata" not in _modules_after(*argv), argv


@pytest.mark.parametrize(
    "argv", [(name,) for name in COMMANDS] + [("guest", "build"), ("cluster", "up")]
)
def test_a_command_help_imports_its_own_module_only(argv: tuple[str, ...]) -> None:
    modules = _modules_after(*argv, "--help")
    own = COMMANDS[argv[0]].module
    assert _command_modules(modules) == {own, *ALSO_IMPORTS.get(own, set())}
    assert not _heavy(modules), f"{' '.join(argv)} --help imports {_heavy(modules)}"


def test_the_table_says_what_each_command_says_of_itself() -> None:
    for name, entry in COMMANDS.items():
        command = load_commands(entry.module)[name]
        assert entry.summary == command.get_short_help_str(limit=10_000)


class _Eager(click.Group):
    """A plain click group holding every command, in the table's order."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


def test_top_level_help_lists_the_table_as_click_would() -> None:
    """The help built from the table is the help click builds by asking each command."""
    eager = _Eager(name="hpcvm", help=cli.help, params=cli.params)
    for name, entry in COMMANDS.items():
        eager.add_command(load_commands(entry.module)[name])
    lazy_help = cli.get_help(click.Context(cli, info_name="hpcvm")).split("Commands:")[1]
    eager_help = eager.get_help(click.Context(eager, info_name="hpcvm")).split("Commands:")[1]
    assert lazy_help == eager_help
    assert all(f"  {name}  " in lazy_help for name in COMMANDS)


def test_the_built_in_suites_are_the_registry_s() -> None:
    from hpcvm.bench.suites.registry import REGISTRY

    assert tuple(REGISTRY) == BUILTIN_SUITES  # no plugin loaded in this process
    assert registered_suite_names() == tuple(REGISTRY)


def test_help_reads_each_suite_s_own_options_as_the_registry_holds_them() -> None:
    """--help reads the built-in kinds' flags from their light packages; once the
    registry is loaded it reads them from the kinds: the two are the same flags."""
    import importlib

    import hpcvm.bench.run.choices as choices
    from hpcvm.bench.suites.registry import REGISTRY

    light = {n: importlib.import_module(f"hpcvm.bench.suites.{n}").FLAGS for n in BUILTIN_SUITES}
    assert light == {name: kind.flags for name, kind in REGISTRY.items()}
    assert choices.registered_flags() == light
