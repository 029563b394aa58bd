"""Entry point: builds the click group from the per-command modules and maps
HpcvmError to a one-line message and the error's exit code (no traceback)."""

from __future__ import annotations

import importlib
import sys

import click

from hpcvm import __version__
from hpcvm.errors import HpcvmError
from hpcvm.plugins import load_plugins

# Command name -> the module under hpcvm.cli that registers it. Modules are imported only
# when their command runs, so `hpcvm exec` does not pay for scipy and matplotlib.
COMMAND_MODULES: dict[str, str] = {
    "host": "host_cmd",
    "plan": "plan_cmd",
    "guest": "guest_cmd",
    "up": "vm_cmd",
    "ps": "vm_cmd",
    "exec": "vm_cmd",
    "verify": "verify_cmd",
    "down": "vm_cmd",
    "run": "vm_cmd",
    "bench": "bench_cmd",
    "results": "bench_cmd",
    "report": "report_cmd",
    "tune": "tune_cmd",
    "cluster": "cluster_cmd",
    "checkpoint": "checkpoint_cmd",
    "restore": "checkpoint_cmd",
}


def load_commands(module_name: str) -> dict[str, click.Command]:
    """Import one command module and return the commands its ``register`` adds."""
    module = importlib.import_module(f"hpcvm.cli.{module_name}")
    scratch = click.Group()
    module.register(scratch)
    return dict(scratch.commands)


class LazyGroup(click.Group):
    """A click group that imports a command's module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMAND_MODULES.get(cmd_name)
        if module_name is None:
            return None
        return load_commands(module_name).get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcvm")
def cli() -> None:
    """Near-native virtual machines for HPC, and the proof.

    host: read this machine; plan: the tuned VM for it; up/exec/verify/down: run it;
    bench/results/report: measure native against VM.
    """


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    try:
        load_plugins()
        result = cli.main(args=argv, prog_name="hpcvm", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("hpcvm: interrupted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except HpcvmError as exc:
        click.echo(f"hpcvm: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("hpcvm: interrupted", err=True)
        return 130
    return result if isinstance(result, int) else 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
