"""`hpcvm plan`: the tuned VM for a host, as tables, JSON, a QEMU line, libvirt XML, an
OpenStack flavor (commands) or a KubeVirt VirtualMachine (YAML).

Thin: parse flags into a PlanRequest, read the host, call the pure planner, print.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcvm.cli.common import console, host_source_options, warn
from hpcvm.plan.names import ACCEL_CHOICES, PROFILE_NAMES, SMT_POLICIES
from hpcvm.render.targets import TARGETS

if TYPE_CHECKING:
    from hpcvm.plan.model import TakenPus

TABLE = "table"  # the plan for a person; every other --format is a render target


@click.command("plan")
@click.option("--profile", type=click.Choice(PROFILE_NAMES), required=True, help="Tuning step.")
@click.option("--vcpus", type=int, required=True, help="Number of vCPUs.")
@click.option("--memory", "memory", required=True, help="Guest RAM, e.g. 4G or 1536M.")
@click.option(
    "--page-size", default=None, help="4K, 2M or 1G (default: 2M for hugepages/numa/hpc)."
)
@click.option("--housekeeping", type=int, default=None, help="hpc: cores per used node for QEMU.")
@click.option("--guest-nodes", type=int, default=None, help="numa/hpc: number of guest nodes.")
@click.option("--passthrough", multiple=True, help="hpc: PCI device to pass (repeatable).")
@click.option("--accel", type=click.Choice(ACCEL_CHOICES), default="auto")
@click.option(
    "--smt",
    type=click.Choice(SMT_POLICIES),
    default=None,
    help="SMT siblings: cores (default: one vCPU per physical core, siblings only when "
    "cores run out), pack (fill siblings, fewest nodes), require (siblings only). "
    "OpenStack hw:cpu_thread_policy isolate / prefer / require.",
)
@click.option(
    "--share",
    "shares",
    multiple=True,
    metavar="HOST_DIR[:GUEST_DIR][:rw]",
    help="Table: show what a built-in guest started here with these shares would see.",
)
@click.option("--name", default="hpcvm", show_default=True, help="VM name.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice([TABLE, *TARGETS]),
    default=TABLE,
    show_default=True,
    help="table (for a person), or: "
    + "; ".join(f"{t.name}: {t.description}" for t in TARGETS.values()),
)
@host_source_options
def plan_command(
    profile: str,
    vcpus: int,
    memory: str,
    page_size: str | None,
    housekeeping: int | None,
    guest_nodes: int | None,
    passthrough: tuple[str, ...],
    accel: str,
    smt: str | None,
    shares: tuple[str, ...],
    name: str,
    fmt: str,
    sysfs_root: Path | None,
    topology: Path | None,
) -> None:
    """Plan the VM: vNUMA, pinning, huge pages, QEMU's threads, CPU model, clock,
    passthrough, and the tuning to match; every decision explained."""
    from hpcvm.host import discover
    from hpcvm.plan import plan as make_plan
    from hpcvm.plan.model import PlanRequest
    from hpcvm.render.targets import get as get_target
    from hpcvm.units import parse_size

    request = PlanRequest.model_validate(
        {
            "name": name,
            "profile": profile,
            "vcpus": vcpus,
            "memory_bytes": parse_size(memory, what="--memory"),
            "page_size_bytes": parse_size(page_size, what="--page-size") if page_size else None,
            "housekeeping": housekeeping,
            "guest_nodes": guest_nodes,
            "passthrough": passthrough,
            "accel": accel,
            "smt": smt,
        }
    )
    host = discover(sysfs_root=sysfs_root, xml=topology)
    live = sysfs_root is None and topology is None
    vm = make_plan(host, request, _running_vms() if live else ())
    if fmt == TABLE:
        from hpcvm.cli.plan_view import print_plan
        from hpcvm.runtime.hostside.shares import preview

        seen = preview(shares, warn=warn)  # a bad --share is refused before any output
        print_plan(vm, console, host)
        console.print("guest sees: " + "; ".join(seen), highlight=False, soft_wrap=True)
        return
    target = get_target(fmt)
    click.echo(target.render(vm, host))
    if target.warns:
        for message in vm.warnings:
            warn(message)


def _running_vms() -> tuple[TakenPus, ...]:
    """The PUs this user's running VMs hold, so the plan shown is the one ``up`` would
    make now (runtime/machine/taken.py); none when the runtime directory cannot be read (``up``
    says why there)."""
    from hpcvm.errors import HpcvmError
    from hpcvm.runtime.machine.taken import live_taken

    try:
        return live_taken()
    except HpcvmError:
        return ()


def register(group: click.Group) -> None:
    """Add this module's commands to the CLI group."""
    group.add_command(plan_command)
