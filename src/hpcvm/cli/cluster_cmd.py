"""`hpcvm cluster up|ps|exec|down`: tuned VMs on every node of a Slurm job.

Thin: options become a ClusterSpec, hpcvm/cluster/ does the work. Run inside an
allocation (a batch script under ``sbatch -N N``, or ``salloc``), on its first node.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from hpcvm.cli.common import console, err_console
from hpcvm.cli.vm_cmd import _request, _vm_options
from hpcvm.errors import UsageError
from hpcvm.signals import interrupting

DEFAULT_UP_TIMEOUT = 300.0
DEFAULT_NETWORK = "bridge=br0"


def _say(text: str) -> None:
    err_console.print(text, highlight=False, markup=False)


@click.group("cluster")
def cluster() -> None:
    """Tuned VMs on every node of a Slurm job, joined by a network, running MPI.

    In a batch script (sbatch -N 2): cluster up starts one VM per allocated node, each
    planned for its node; cluster exec runs a command (mpirun) in the first VM with
    ranks on every VM; cluster ps lists them; cluster down stops them all. scancel or
    the job's end stops them too.
    """


@cluster.command("up")
@click.option("--name", required=True, help="Name of the cluster (e.g. $SLURM_JOB_ID).")
@_vm_options
@click.option(
    "--timeout",
    type=float,
    default=DEFAULT_UP_TIMEOUT,
    show_default=True,
    help="Seconds for every VM to come up before all are taken down.",
)
def up_cmd(name: str, timeout: float, **kw: Any) -> int:
    """Start one VM per node of this Slurm allocation; return when every guest answers.

    --network is each node's (default bridge=br0); --address is the first node's VM
    address, and the k-th node's VM gets the k-th next one (no DHCP server needed).
    """
    from hpcvm.cluster import control
    from hpcvm.runtime.network import parse_address

    first_address = kw["address"]
    if not first_address:
        raise UsageError(
            "cluster up needs --address IP/PREFIX: the first node's VM address on the "
            "network (the k-th node's VM gets the k-th next one)"
        )
    parse_address(first_address)
    fields: dict[str, object] = {
        "request": _request(kw),
        "backend": kw["backend"],
        "kernel": kw["kernel"],
        "initrd": kw["initrd"],
        "image": kw["image"],
        "shares": tuple(kw["shares"]),
        "ready_timeout": kw["ready_timeout"],
        "workdir": os.getcwd(),
        "network": kw["network"] or DEFAULT_NETWORK,
        "first_address": first_address,
    }
    with interrupting():
        ready = control.up(fields, name, timeout, _say)
    _say(f"{name}: {len(ready)} VM(s) up")
    return 0


@cluster.command("ps")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ps_cmd(name: str, as_json: bool) -> int:
    """One row per node: host, VM, state, guest address, vCPU -> host PU pins."""
    from rich.table import Table

    from hpcvm.cluster import control

    record, latest, alive = control.status(name)
    if as_json:
        rows = [e.model_dump(exclude={"step"}) for e in latest]
        console.print_json(
            data={"name": name, "job": record.job_id, "holder": alive, "nodes": rows}
        )
        return 0
    table = Table(title=f"cluster {name} (job {record.job_id})")
    for column in ("node", "VM", "state", "address", "vCPU -> PU", "profile", "accel"):
        table.add_column(column)
    by_index = {e.index: e for e in latest}
    for i, node in enumerate(record.nodes):
        e = by_index.get(i)
        if e is None:
            table.add_row(node, "", "starting" if alive else "gone", "", "", "", "")
            continue
        pins = " ".join(f"{v}->{'-' if pu is None else pu}" for v, pu in enumerate(e.vcpu_pus))
        state = e.event if alive or e.event != "ready" else "gone"
        table.add_row(node, e.vm, state, e.address or "", pins, e.profile or "", e.accel or "")
    console.print(table)
    return 0


@cluster.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.option("--timeout", type=float, default=None, help="Seconds before giving up (exit 124).")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(name: str, timeout: float | None, argv: tuple[str, ...]) -> int:
    """Run a command in the first VM; mpirun there starts ranks on every VM of the job."""
    from hpcvm.cluster import control

    result = control.exec_first(name, argv, os.getcwd(), timeout)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.exit_code


@cluster.command("down")
@click.argument("name")
def down_cmd(name: str) -> int:
    """Stop every VM of the cluster on every node and remove what hpcvm made."""
    from hpcvm.cluster import control

    control.down(name, _say)
    _say(f"{name}: down")
    return 0


@cluster.command("node", hidden=True)
def node_cmd() -> int:
    """One node's task of the holder step (started by cluster up through srun)."""
    from hpcvm.cluster import node

    return node.run()


@cluster.command("placement", hidden=True)
@click.argument("config_json")
def placement_cmd(config_json: str) -> int:
    """This node's native PUs for a bench --nodes run (started by bench through srun)."""
    from hpcvm.cluster import native_places

    click.echo(native_places.this_node(config_json))
    return 0


def register(group: click.Group) -> None:
    group.add_command(cluster)
