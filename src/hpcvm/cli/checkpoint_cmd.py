"""`hpcvm checkpoint` and `hpcvm restore`: save a VM into a directory, start it again.

Thin: runtime/checkpoint/save_restore.py does the work and refuses what it cannot do in one line
(errors.py exit codes: a damaged checkpoint or a VM that cannot be saved is a usage
error, a host or QEMU that cannot take the saved guest is infeasible).
"""

from __future__ import annotations

from pathlib import Path

import click

from hpcvm.cli.common import console, warn
from hpcvm.signals import interrupting
from hpcvm.units import format_cpu_list, human_size


@click.command("checkpoint")
@click.argument("name")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--resume",
    "resume_after",
    is_flag=True,
    help="Run the VM again once it is saved (default: stop it).",
)
def checkpoint_cmd(name: str, directory: Path, resume_after: bool) -> int:
    """Pause VM NAME, save its RAM, devices and disk into DIRECTORY (a new directory),
    then stop it, or with --resume run it on."""
    from hpcvm.runtime.checkpoint import save_restore as ckpt

    with interrupting():
        saved = ckpt.checkpoint(name, directory, resume_after=resume_after)
    rate = (saved.state_bytes + saved.disk_bytes) / saved.seconds if saved.seconds else 0.0
    console.print(
        f"{name}: saved to {saved.directory} in {saved.seconds:.1f} s (state "
        f"{human_size(saved.state_bytes)}, disk {human_size(saved.disk_bytes)}, "
        f"{human_size(int(rate))}/s); {'running again' if resume_after else 'stopped'}",
        highlight=False,
        soft_wrap=True,
    )
    return 0


@click.command("restore")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--name", default=None, help="Name of the restored VM (default: the saved one).")
def restore_cmd(directory: Path, name: str | None) -> int:
    """Start the VM saved in DIRECTORY on this host: re-planned here (pins, memory
    binding, huge pages), with the very same guest; its clock is stepped to the host's."""
    from hpcvm.runtime.checkpoint import save_restore as ckpt

    with interrupting():
        restored = ckpt.restore(directory, name=name, warn=warn)
    machine = restored.machine
    for text in machine.plan.warnings:
        warn(text)
    pus = machine.plan.vcpu_pus()
    pinned = f"vCPUs on PUs {format_cpu_list(pus)}" if pus else "vCPUs not pinned"
    console.print(
        f"{machine.name}: restored from {restored.checkpoint.directory} in "
        f"{restored.seconds:.1f} s (pid {machine.pid}, {machine.plan.accel}, {pinned})",
        highlight=False,
        soft_wrap=True,
    )
    clock = restored.clock
    if clock is not None and clock.ok:
        console.print(
            f"{machine.name}: guest clock was {clock.behind_before:.1f} s behind the host's; "
            f"stepped to it (now {clock.behind_after:+.3f} s)",
            highlight=False,
        )
    return 0


def register(group: click.Group) -> None:
    """Add this module's commands to the CLI group."""
    for command in (checkpoint_cmd, restore_cmd):
        group.add_command(command)
