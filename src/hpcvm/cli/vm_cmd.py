"""`hpcvm up`, `ps`, `exec`, `down` and `run`: start, list, use and stop VMs.

Thin: options become a VmRequest (cli/vm_options.py), runtime/vm/lifecycle.py does the work.
Exit codes: errors as in errors.py; `exec` and `run` exit with the guest command's code
(128+N when a signal killed it), 124 when it outlives --timeout, like timeout(1), 130
when interrupted (Ctrl-C, SIGTERM), 127 and 126 for a program the guest does not have
or cannot execute, as a shell. A command timed out or interrupted is ended in the guest
first (runtime/channels/guest_process.py), and one line says so.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcvm.cli.common import console, err_console, seconds, warn
from hpcvm.cli.vm_options import no_stdin_option, vm_options, vm_request
from hpcvm.runtime.machine.timeouts import DOWN_TIMEOUT
from hpcvm.signals import interrupting
from hpcvm.units import format_size

if TYPE_CHECKING:  # imported where a command runs, so that --help imports no runtime
    from rich.console import Console

    from hpcvm.runtime.channels.agent_errors import ExecInterrupted
    from hpcvm.runtime.machine.model import ExecResult, Machine
    from hpcvm.runtime.machine.options import VmRequest

INTERRUPTED_EXIT = 130  # as a shell reports Ctrl-C (cli/main.py)


def _start(name: str, request: VmRequest, *, out: Console = console) -> Machine:
    from hpcvm.runtime.hostside.shares import describe as describe_shares
    from hpcvm.runtime.machine.options import UpOptions
    from hpcvm.runtime.vm import lifecycle

    begin = time.monotonic()
    options = UpOptions(**request.vm.model_dump(), name=name)
    machine = lifecycle.up(request.plan, options, warn=warn)
    for text in machine.plan.warnings:
        warn(text)
    plan = machine.plan
    out.print(
        f"{machine.name}: up in {time.monotonic() - begin:.1f} s (pid {machine.pid}, "
        f"{machine.backend}, {plan.accel}, profile {plan.profile}, {plan.vcpus} vCPU, "
        f"{format_size(plan.memory_bytes)})",
        highlight=False,
    )
    for nic in machine.boot.nics:
        out.print(
            f"{machine.name}: {nic.model} NIC {nic.mac} on {nic.kind} {nic.source} (tap "
            f"{nic.ifname}, MTU {nic.mtu}{', vhost-net' if nic.vhost else ''}), address "
            f"{nic.address or 'none'}",
            highlight=False,
        )
    lines = describe_shares(machine.boot.shares, machine.boot.links)
    out.print(
        f"{machine.name}: guest sees " + ("; ".join(lines) or "no host directory"),
        highlight=False,
        soft_wrap=True,
    )
    return machine


def _command_input(program: str, read: bool) -> bytes | None:
    """What the guest command gets on stdin: ours, unless it is a terminal (a user at a
    prompt types nothing for the command, so it is not read), or not there, or
    ``read`` is off (``--no-stdin``: a script whose stdin never ends). Read to its end
    first: the agent takes a command's input in one message, so at most MAX_INPUT."""
    from hpcvm.errors import UsageError
    from hpcvm.runtime.channels.agent_errors import MAX_INPUT, check_input

    stream = sys.stdin
    if not read or stream is None or stream.isatty():
        return None
    try:
        data = stream.buffer.read(MAX_INPUT + 1)
    except OSError as exc:
        raise UsageError(f"cannot read stdin: {exc.strerror}; give --no-stdin") from exc
    check_input(program, data)
    return data


def _interrupted(exc: ExecInterrupted) -> int:
    """The one line that says what became of the interrupted guest command."""
    click.echo(f"hpcvm: interrupted; {exc.what}", err=True)
    return INTERRUPTED_EXIT


def _print_result(result: ExecResult) -> int:
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    sys.stderr.flush()
    return result.exit_code  # 128 + N when signal N killed it (runtime/channels/agent.py)


@click.command("up")
@click.option("--name", required=True, help="Name of the VM (used by exec, down...).")
@vm_options
def up_cmd(name: str, **kw: Any) -> int:
    """Plan a VM for this host, boot it and wait until commands can run in it."""
    request = vm_request(kw)
    with interrupting():
        _start(name, request)
    return 0


@click.command("ps")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ps_cmd(as_json: bool) -> int:
    """List VMs; remove the records of VMs whose QEMU is gone (stale)."""
    from hpcvm.runtime.vm import inventory

    rows = inventory.list_vms()  # no models for hpcvm's own QEMU VMs (runtime/vm/inventory.py)
    if as_json:
        click.echo(json.dumps([row.__dict__ for row in rows], indent=2))
        return 0
    if not rows:
        click.echo("no VMs")  # what rich printed: plain words, no markup
        return 0
    from rich.table import Table  # only for the table: --json needs none of rich

    table = Table(box=None, header_style="bold")
    columns = ["name", "backend", "state", "pid", "uptime", "profile", "vcpus", "memory"]
    with_address = any(r.addresses for r in rows)
    for col in [*columns, "address"] if with_address else columns:
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.name,
            r.backend,
            r.state + (f" ({r.note})" if r.note else ""),
            str(r.pid or "-"),
            _duration(r.uptime),
            r.profile or "-",
            str(r.vcpus or "-"),
            format_size(r.memory_bytes) if r.memory_bytes else "-",
            *([" ".join(r.addresses) or "-"] if with_address else []),
        )
    console.print(table)
    return 0


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.option(
    "--timeout",
    callback=seconds,
    metavar="SECONDS",
    default=None,
    help="Seconds before giving up (exit 124).",
)
@no_stdin_option
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(name: str, timeout: float | None, no_stdin: bool, argv: tuple[str, ...]) -> int:
    """Run a command in the guest (no shell) and exit with its exit code.

    stdin, unless a terminal, is the command's. Interrupted (Ctrl-C, SIGTERM) or past
    --timeout, the command is ended in the guest too."""
    from hpcvm.runtime.channels.agent_errors import ExecInterrupted
    from hpcvm.runtime.machine.handle import read_handle
    from hpcvm.runtime.vm.guest_exec import exec_in

    vm = read_handle(name)  # no models: scripts call exec in loops (runtime/machine/handle.py)
    try:
        with interrupting():
            data = _command_input(argv[0], not no_stdin)
            return _print_result(exec_in(vm, argv, timeout, input=data))
    except ExecInterrupted as exc:
        return _interrupted(exc)


@click.command("down")
@click.argument("name", required=False)
@click.option("--all", "all_", is_flag=True, help="Stop every VM.")
@click.option(
    "--orphans",
    is_flag=True,
    help="Stop every VM whose owning hpcvm process (a bench, a run) died without taking "
    "it down (`hpcvm ps` shows them as orphaned).",
)
@click.option(
    "--timeout",
    type=str,
    callback=seconds,
    metavar="SECONDS",
    default=DOWN_TIMEOUT,
    show_default=True,
    help="Seconds for a clean shutdown before QEMU is killed.",
)
def down_cmd(name: str | None, all_: bool, orphans: bool, timeout: float) -> int:
    """Shut a VM down (guest shutdown, QMP quit, then kill) and remove its files."""
    from hpcvm.runtime.vm import inventory, stopping

    if [name is not None, all_, orphans].count(True) != 1:
        raise click.UsageError("give a VM name, --all or --orphans")
    # Lines through click, not rich (what rich printed: a VM name is plain words well
    # under its 80 columns): down imports neither rich nor, for hpcvm's own QEMU VMs,
    # the models (runtime/vm/stopping.py).
    if name is not None:
        stopping.down(name, timeout)
        click.echo(f"{name}: down")
        return 0
    vms = inventory.running_vms(orphaned=orphans)
    if orphans and not vms:
        click.echo("no orphaned VMs")
    for vm in vms:
        stopping.stop(vm, timeout)
        click.echo(f"{vm.name}: down")
    inventory.list_vms()  # cleans what is stale
    return 0


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--name", default=None, help="Name of the VM (default run-<pid>).")
@click.option(
    "--timeout",
    callback=seconds,
    metavar="SECONDS",
    default=None,
    help="Seconds for the command (exit 124).",
)
@no_stdin_option
@vm_options
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(
    name: str | None, timeout: float | None, no_stdin: bool, argv: tuple[str, ...], **kw: Any
) -> int:
    """Boot a VM, run one command in it, and always take the VM down again.

    stdin, unless a terminal, is the command's. The VM is this process's: killed
    outright (SIGKILL), it leaves the VM "orphaned" for `hpcvm down --orphans`."""
    from hpcvm.runtime.channels.agent_errors import ExecInterrupted
    from hpcvm.runtime.machine import state
    from hpcvm.runtime.vm import stopping
    from hpcvm.runtime.vm.guest_exec import exec_in

    request = vm_request(kw)
    vm_name = name or f"run-{os.getpid()}"
    command = _absolute_program(argv)
    try:
        with interrupting():
            data = _command_input(command[0], not no_stdin)  # refused before any boot
            with state.owned_by_this_process("hpcvm run"):
                machine = _start(vm_name, request, out=err_console)  # stdout: the command's
            try:
                result = exec_in(machine, command, timeout, input=data)
            finally:
                stopping.stop(machine)
    except ExecInterrupted as exc:
        return _interrupted(exc)
    return _print_result(result)


def _absolute_program(argv: tuple[str, ...]) -> tuple[str, ...]:
    """``./app`` as an absolute path: the guest sees the working directory at the same
    path but the agent starts commands in ``/``, not in the caller's directory."""
    program = argv[0]
    if "/" in program and not program.startswith("/"):
        return (str(Path(program).absolute()), *argv[1:])
    return argv


def register(group: click.Group) -> None:
    """Add this module's commands to the CLI group."""
    for command in (up_cmd, ps_cmd, exec_cmd, down_cmd, run_cmd):
        group.add_command(command)
