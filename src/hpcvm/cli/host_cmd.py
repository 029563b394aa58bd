"""`hpcvm host`: show what discovery read from this machine, a snapshot or an XML."""

from __future__ import annotations

from pathlib import Path

import click

from hpcvm.cli.common import console, host_source_options, warn


@click.command("host")
@click.option("--json", "as_json", is_flag=True, help="Print the HostTopology as JSON.")
@host_source_options
def host_command(as_json: bool, sysfs_root: Path | None, topology: Path | None) -> None:
    """Read a host: packages, NUMA nodes, distances, SMT siblings, caches, huge pages,
    THP, KVM, IOMMU and PCI devices."""
    from hpcvm.cli.host_view import print_host
    from hpcvm.host import discover

    host = discover(sysfs_root=sysfs_root, xml=topology)
    if as_json:
        click.echo(host.model_dump_json(indent=2))
        return
    print_host(host, console)
    for message in host.warnings:
        warn(message)


def register(group: click.Group) -> None:
    """Add this module's commands to the CLI group."""
    group.add_command(host_command)
