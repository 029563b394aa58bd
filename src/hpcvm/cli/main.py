"""Entry point: builds the click group from the per-command modules and maps
HpcvmError to a one-line message and the error's exit code (no traceback)."""

from __future__ import annotations

import sys

import click

from hpcvm import __version__
from hpcvm.errors import HpcvmError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcvm")
def cli() -> None:
    """Near-native virtual machines for HPC, and the proof.

    host: read this machine; plan: the tuned VM for it; up/exec/verify/down: run it;
    bench/results/report: measure native against VM.
    """


def _register_commands() -> None:
    # Each command module adds its commands to the group; keep one line per module.
    from hpcvm.cli import (
        bench_cmd,
        guest_cmd,
        host_cmd,
        plan_cmd,
        report_cmd,
        verify_cmd,
        vm_cmd,
    )

    for module in (host_cmd, plan_cmd, guest_cmd, vm_cmd, report_cmd, verify_cmd, bench_cmd):
        module.register(cli)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    _register_commands()
    try:
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
