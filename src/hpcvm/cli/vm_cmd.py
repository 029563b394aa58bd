"""`hpcvm up`, `ps`, `exec`, `down` and `run`: start, list, use and stop VMs.

Thin: options become a PlanRequest and UpOptions, runtime/lifecycle.py does the work.
Exit codes: errors as in errors.py; `exec` and `run` exit with the guest command's code
(128+N when a signal killed it) and 124 when it outlives --timeout, like timeout(1).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from hpcvm.cli.common import console, err_console, warn
from hpcvm.plan.names import PROFILE_NAMES
from hpcvm.runtime.backends import BACKENDS
from hpcvm.runtime.timeouts import DOWN_TIMEOUT
from hpcvm.signals import interrupting
from hpcvm.units import format_size, parse_size

if TYPE_CHECKING:  # imported where a command runs, so that --help imports no runtime
    from rich.console import Console

    from hpcvm.plan.model import PlanRequest
    from hpcvm.runtime import lifecycle
    from hpcvm.runtime.model import BackendName, ExecResult, Machine

F = TypeVar("F", bound=Callable[..., Any])


def _vm_options(func: F) -> F:
    """The VM's shape and how to boot it; shared by `up` and `run`."""
    options = [
        click.option(
            "--profile", required=True, type=click.Choice(PROFILE_NAMES), help="Tuning profile."
        ),
        click.option("--vcpus", required=True, type=int, help="Number of vCPUs."),
        click.option("--memory", required=True, help="Guest memory, e.g. 2G or 512M."),
        click.option("--page-size", default=None, help="4K, 2M or 1G (profile default)."),
        click.option(
            "--housekeeping", type=int, default=None, help="hpc: cores per node for QEMU."
        ),
        click.option(
            "--guest-nodes", type=int, default=None, help="numa/hpc: number of guest nodes."
        ),
        click.option("--passthrough", multiple=True, help="hpc: PCI device to pass (repeatable)."),
        click.option(
            "--accel",
            type=click.Choice(["auto", "kvm", "tcg"]),
            default="auto",
            show_default=True,
            help="KVM, TCG, or KVM when a probe guest boots on it.",
        ),
        click.option(
            "--backend",
            type=click.Choice(list(BACKENDS)),
            default="qemu",
            show_default=True,
            help="Run QEMU directly (QMP) or through libvirt.",
        ),
        click.option("--connect", "connect_uri", default=None, help="libvirt URI."),
        click.option("--kernel", default=None, help="Boot this kernel (with --initrd)."),
        click.option("--initrd", default=None, help="Initramfs for --kernel."),
        click.option("--image", default=None, help="Boot a disk image instead of a kernel."),
        click.option(
            "--share",
            "shares",
            multiple=True,
            metavar="HOST_DIR[:GUEST_DIR][:rw]",
            help="Share a host directory with the guest, read-only unless :rw "
            "(repeatable). The built-in guest also sees /usr, /bin, /sbin, /lib*, /opt, "
            "/etc without secrets and the working directory, read-only.",
        ),
        click.option(
            "--network",
            default=None,
            metavar="KIND=SOURCE[,model=virtio|e1000][,mtu=N]",
            help="Give the VM a NIC on the host network: bridge=BR (a tap in bridge BR; "
            "model=e1000 alone means bridge=br0), macvtap=NIC (a macvtap in bridge mode on "
            "the host's Ethernet NIC) or vf=auto|PCI_ADDRESS (an SR-IOV VF passed through, "
            "hpc profile). See docs/networking.md.",
        ),
        click.option(
            "--address",
            default=None,
            metavar="IPV4/PREFIX",
            help="The guest's address on --network (e.g. 10.77.0.101/24), set by the "
            "guest itself at boot.",
        ),
        click.option(
            "--ready-timeout",
            type=float,
            default=None,
            help="Seconds to wait for the guest agent (default 90 under TCG, 30 under KVM; "
            "or $HPCVM_READY_TIMEOUT).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _request(kw: dict[str, Any]) -> PlanRequest:
    from hpcvm.plan.model import PlanRequest

    page = kw["page_size"]
    return PlanRequest(
        profile=kw["profile"],
        vcpus=kw["vcpus"],
        memory_bytes=parse_size(kw["memory"], what="--memory"),
        page_size_bytes=parse_size(page, what="--page-size") if page else None,
        housekeeping=kw["housekeeping"],
        guest_nodes=kw["guest_nodes"],
        passthrough=tuple(kw["passthrough"]),
        accel=kw["accel"],
    )


def _up_options(name: str, kw: dict[str, Any]) -> lifecycle.UpOptions:
    from hpcvm.runtime import lifecycle

    return lifecycle.UpOptions(
        name=name,
        backend=cast("BackendName", kw["backend"]),
        connect_uri=kw["connect_uri"],
        kernel=kw["kernel"],
        initrd=kw["initrd"],
        image=kw["image"],
        ready_timeout=kw["ready_timeout"],
        shares=tuple(kw["shares"]),
        network=kw["network"],
        address=kw["address"],
    )


def _start(name: str, kw: dict[str, Any], *, out: Console = console) -> Machine:
    from hpcvm.runtime import lifecycle
    from hpcvm.runtime.shares import describe as describe_shares

    begin = time.monotonic()
    machine = lifecycle.up(_request(kw), _up_options(name, kw), warn=warn)
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


def _print_result(result: ExecResult) -> int:
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    sys.stderr.flush()
    return result.exit_code  # 128 + N when signal N killed it (runtime/agent.py)


@click.command("up")
@click.option("--name", required=True, help="Name of the VM (used by exec, down...).")
@_vm_options
def up_cmd(name: str, **kw: Any) -> int:
    """Plan a VM for this host, boot it and wait until commands can run in it."""
    with interrupting():
        _start(name, kw)
    return 0


@click.command("ps")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ps_cmd(as_json: bool) -> int:
    """List VMs; remove the records of VMs whose QEMU is gone (stale)."""
    from rich.table import Table

    from hpcvm.runtime import lifecycle

    rows = lifecycle.list_vms()
    if as_json:
        click.echo(json.dumps([row.__dict__ for row in rows], indent=2))
        return 0
    if not rows:
        console.print("no VMs", highlight=False)
        return 0
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
@click.option("--timeout", type=float, default=None, help="Seconds before giving up (exit 124).")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(name: str, timeout: float | None, argv: tuple[str, ...]) -> int:
    """Run a command in the guest (no shell) and exit with its exit code."""
    from hpcvm.runtime import lifecycle
    from hpcvm.runtime.state import load_machine

    machine = load_machine(name)
    return _print_result(lifecycle.exec_in(machine, argv, timeout))


@click.command("down")
@click.argument("name", required=False)
@click.option("--all", "all_", is_flag=True, help="Stop every VM.")
@click.option(
    "--timeout",
    type=float,
    default=DOWN_TIMEOUT,
    show_default=True,
    help="Seconds for a clean shutdown before QEMU is killed.",
)
def down_cmd(name: str | None, all_: bool, timeout: float) -> int:
    """Shut a VM down (guest shutdown, QMP quit, then kill) and remove its files."""
    from hpcvm.runtime import lifecycle

    if all_ == (name is not None):
        raise click.UsageError("give a VM name or --all")
    if name is not None:
        lifecycle.down(name, timeout)
        console.print(f"{name}: down", highlight=False)
        return 0
    for machine in lifecycle.running_machines():
        lifecycle.stop(machine, timeout)
        console.print(f"{machine.name}: down", highlight=False)
    lifecycle.list_vms()  # cleans what is stale
    return 0


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--name", default=None, help="Name of the VM (default run-<pid>).")
@click.option("--timeout", type=float, default=None, help="Seconds for the command (exit 124).")
@_vm_options
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(name: str | None, timeout: float | None, argv: tuple[str, ...], **kw: Any) -> int:
    """Boot a VM, run one command in it, and always take the VM down again."""
    from hpcvm.runtime import lifecycle

    vm_name = name or f"run-{os.getpid()}"
    command = _absolute_program(argv)
    with interrupting():
        machine = _start(vm_name, kw, out=err_console)  # stdout is the command's
        try:
            result = lifecycle.exec_in(machine, command, timeout)
        finally:
            lifecycle.stop(machine)
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
