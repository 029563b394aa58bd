"""Entry point: builds the click group from the per-command modules and maps
HpcvmError to a one-line message and the error's exit code (no traceback): click's own
usage errors too, and, as a last resort, an OSError no command named first."""

from __future__ import annotations

import importlib
import os
import sys
from typing import NamedTuple

import click

from hpcvm import __version__
from hpcvm.errors import HpcvmError, UsageError
from hpcvm.plugins import load_plugins


class LazyCommand(NamedTuple):
    """Where a command lives and the one sentence ``hpcvm --help`` shows for it.

    The sentence is the first of the command's own docstring (a unit test holds them
    equal), kept here so that listing the commands imports none of their modules."""

    module: str  # under hpcvm.cli; imported only when the command runs or shows its help
    summary: str


COMMANDS: dict[str, LazyCommand] = {
    "host": LazyCommand(
        "host_cmd",
        "Read a host: packages, NUMA nodes, distances, SMT siblings, caches, huge pages, "
        "THP, KVM, IOMMU and PCI devices.",
    ),
    "plan": LazyCommand(
        "plan_cmd",
        "Plan the VM: vNUMA, pinning, huge pages, QEMU's threads, CPU model, clock, "
        "passthrough, and the tuning to match; every decision explained.",
    ),
    "guest": LazyCommand(
        "guest_cmd",
        "The built-in guest: the distribution kernel, an initramfs hpcvm generates, and a "
        "list of host directories shared read-only under a tmpfs overlay.",
    ),
    "up": LazyCommand(
        "vm_cmd", "Plan a VM for this host, boot it and wait until commands can run in it."
    ),
    "ps": LazyCommand("vm_cmd", "List VMs; remove the records of VMs whose QEMU is gone (stale)."),
    "exec": LazyCommand(
        "vm_cmd", "Run a command in the guest (no shell) and exit with its exit code."
    ),
    "verify": LazyCommand(
        "verify_cmd", "Check from inside and outside that a running VM is what its plan says."
    ),
    "down": LazyCommand(
        "vm_cmd", "Shut a VM down (guest shutdown, QMP quit, then kill) and remove its files."
    ),
    "run": LazyCommand(
        "vm_cmd", "Boot a VM, run one command in it, and always take the VM down again."
    ),
    "bench": LazyCommand(
        "bench_cmd",
        "Run benchmarks natively and in VMs, interleaved, into OUT/hpcvm.db; print tables.",
    ),
    "results": LazyCommand(
        "bench_cmd", "Recompute the summaries of a results directory from its database."
    ),
    "report": LazyCommand(
        "report_cmd",
        "Draw the studies' figures (overhead bars with intervals, absolute values, "
        "interrupts against overhead, noise detours) and write the report of RESULTS.",
    ),
    "tune": LazyCommand(
        "tune_cmd",
        "Check, apply or revert the host tuning that keeps a VM's PUs quiet: IRQs, "
        "workqueues, watchdog, timers, vmstat, NUMA balancing, KSM, THP, cpufreq, idle "
        "latency at run time; isolcpus/nohz_full/rcu_nocbs/irqaffinity at boot.",
    ),
    "cluster": LazyCommand(
        "cluster_cmd",
        "Tuned VMs on every node of a batch job, joined by a network, running MPI; "
        "checkpoint the whole job and restore it on other nodes.",
    ),
    "checkpoint": LazyCommand(
        "checkpoint_cmd",
        "Pause VM NAME, save its RAM, devices and disk into DIRECTORY (a new directory), "
        "then stop it, or with --resume run it on.",
    ),
    "restore": LazyCommand(
        "checkpoint_cmd",
        "Start the VM saved in DIRECTORY on this host: re-planned here (pins, memory "
        "binding, huge pages), with the very same guest; its clock is stepped to the host's.",
    ),
}
# Command name -> the module under hpcvm.cli that registers it. Modules are imported only
# when their command runs or shows its own help, so `hpcvm exec` does not pay for scipy
# and matplotlib, and `hpcvm --help` imports no command module at all.
COMMAND_MODULES: dict[str, str] = {name: c.module for name, c in COMMANDS.items()}


def load_commands(module_name: str) -> dict[str, click.Command]:
    """Import one command module and return the commands its ``register`` adds."""
    module = importlib.import_module(f"hpcvm.cli.{module_name}")
    scratch = click.Group()
    module.register(scratch)
    return dict(scratch.commands)


class LazyGroup(click.Group):
    """A click group that imports a command's module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMAND_MODULES.get(cmd_name)
        if module_name is None:
            return None
        return load_commands(module_name).get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from COMMANDS, laid out as click lays out its own."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, click.Command(name, help=c.summary).get_short_help_str(limit))
            for name, c in COMMANDS.items()
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


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
        click.echo(f"hpcvm: error: {click_message(exc)}", err=True)
        return max(exc.exit_code, UsageError.exit_code)  # click.FileError's 1 is no code of ours
    except HpcvmError as exc:
        click.echo(f"hpcvm: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("hpcvm: interrupted", err=True)
        return 130
    except OSError as exc:
        click.echo(f"hpcvm: error: {os_error_message(exc)}", err=True)
        return OS_ERROR_EXIT
    return result if isinstance(result, int) else 0


# The last resort for a file or directory that could not be read or written where no
# check named it first (each such case should get its own message at its source, naming
# the option and the fix): a usage error, as in the README's "Exit codes".
OS_ERROR_EXIT = UsageError.exit_code
OS_ERROR_FIX = "check the path and its permissions"  # ends the line: a test looks for it


def os_error_message(exc: OSError) -> str:
    """One line for an OSError no command turned into an HpcvmError: the path(s) and
    what the system said, instead of a traceback."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    where = [str(os.fsdecode(f)) for f in (exc.filename, exc.filename2) if f is not None]
    if not where:
        return f"{reason}: a file or directory hpcvm needs could not be used"
    return f"{' -> '.join(where)}: {reason}: {OS_ERROR_FIX}"


def click_message(exc: click.ClickException) -> str:
    """click's error in one line (it prints usage, a hint and the error on three): the
    error, and where the command's options are listed."""
    text = " ".join(exc.format_message().split())
    if isinstance(exc, click.UsageError) and exc.ctx is not None:
        return f"{text.rstrip('.')}: see `{exc.ctx.command_path} --help`"
    return text


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
