"""`hpcvm cluster up|ps|exec|down`: tuned VMs on every node of a batch job.

Thin: options become a ClusterRequest, hpcvm/cluster/ does the work. Run inside an
allocation (a batch script under ``sbatch -N N``, or ``salloc``), on its first node, or
on one machine with ``--batch local --nodes N``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from hpcvm.cli.common import console, err_console, seconds
from hpcvm.cli.vm_options import vm_options
from hpcvm.cluster.addresses import AUTO
from hpcvm.cluster.batches import BATCH_SYSTEMS, DEFAULT_BATCH
from hpcvm.errors import UsageError
from hpcvm.signals import interrupting

DEFAULT_UP_TIMEOUT = 300.0
DEFAULT_NETWORK = "bridge=br0"
WIDE = 240  # columns of `cluster ps` when not on a terminal


def _say(text: str) -> None:
    err_console.print(text, highlight=False, markup=False)


@click.group("cluster")
def cluster() -> None:
    """Tuned VMs on every node of a batch job, joined by a network, running MPI.

    In a batch script (sbatch -N 2): cluster up starts one VM per allocated node, each
    planned for its node; cluster exec runs a command (mpirun) in the first VM with
    ranks on every VM; cluster ps lists them; cluster down stops them all. scancel or
    the job's end stops them too. On one machine: cluster up --batch local --nodes N.
    """


@cluster.command("up")
@click.option("--name", required=True, help="Name of the cluster (e.g. $SLURM_JOB_ID).")
@click.option(
    "--batch",
    type=click.Choice(list(BATCH_SYSTEMS)),
    default=DEFAULT_BATCH,
    show_default=True,
    help="The batch system that gives the nodes: slurm (run inside an allocation) or "
    "local (this machine as --nodes nodes, for as long as the calling shell lives).",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=None,
    help="How many nodes (local: made here; slurm: checked against the allocation).",
)
@vm_options
@click.option(
    "--timeout",
    type=str,
    callback=seconds,
    metavar="SECONDS",
    default=DEFAULT_UP_TIMEOUT,
    show_default=True,
    help="Seconds for every VM to come up before all are taken down.",
)
def up_cmd(name: str, batch: str, nodes: int | None, timeout: float, **kw: Any) -> int:
    """Start one VM per node of this allocation; return when every guest answers.

    --network is each node's (default bridge=br0). --address auto gives each VM an
    address of the site's pool derived from its node's own (/etc/hpcvm/site.toml);
    --address IP/PREFIX is the first node's VM's, and the k-th node's VM gets the k-th
    next one. Either way each guest checks its address is free on the segment first.
    """
    from hpcvm.cli.vm_values import VmOptionValues
    from hpcvm.cluster import control
    from hpcvm.cluster.spec import ClusterRequest
    from hpcvm.runtime.network import parse_address

    values = VmOptionValues.parse(kw)
    if not values.address:
        raise UsageError(
            "cluster up needs --address auto (each VM an address of the site's pool, "
            "derived from its node's own) or --address IP/PREFIX (the first node's VM; the "
            "k-th node's VM gets the k-th next one)"
        )
    if values.address != AUTO:
        parse_address(values.address)
    vm = values.vm().model_copy(
        update={"network": values.network or DEFAULT_NETWORK, "address": None}
    )
    request = ClusterRequest(
        plan=values.plan_request(),
        vm=vm,
        name=name,
        batch=batch,
        nodes=nodes,
        first_address=values.address,
        workdir=os.getcwd(),
    )
    with interrupting():
        ready = control.up(request, timeout, _say)
    _say(f"{name}: {len(ready)} VM(s) up")
    return 0


@cluster.command("ps")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ps_cmd(name: str | None, as_json: bool) -> int:
    """One row per node of cluster NAME: host, VM, state, guest address, vCPU -> host
    PU pins. Without NAME, one row per cluster of this node; the state a job killed
    outright left behind (no holder, no up or down running) is removed, as ps removes
    stale VMs (a Slurm epilog runs it: docs/examples/slurm-epilog.sh)."""
    if name is None:
        return _ps_all(as_json)
    from rich.console import Console
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
    # Not cut to 80 columns when piped into a batch job's output: every cell whole.
    (console if console.is_terminal else Console(width=WIDE, emoji=False)).print(table)
    return 0


def _ps_all(as_json: bool) -> int:
    from rich.table import Table

    from hpcvm.cluster import state

    rows: list[tuple[str, str, str, tuple[str, ...], str]] = []
    for name in state.names():
        if state.remove_if_stale(name):
            _say(f"hpcvm: removed the state of cluster {name}: its job has ended")
            continue
        if not state.has_record(name):
            rows.append((name, "", "", (), "starting"))
            continue
        record = state.read_record(name)
        rows.append((name, record.batch, record.job_id, record.nodes, "up"))
    if as_json:
        keys = ("name", "batch", "job", "nodes", "state")
        console.print_json(data=[dict(zip(keys, row, strict=True)) for row in rows])
        return 0
    table = Table(title="clusters on this node")
    for column in ("name", "batch", "job", "nodes", "state"):
        table.add_column(column)
    for name, batch, job, nodes, up in rows:
        table.add_row(name, batch, job, ",".join(nodes), up)
    console.print(table)
    return 0


@cluster.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.option(
    "--timeout",
    callback=seconds,
    metavar="SECONDS",
    default=None,
    help="Seconds before giving up (exit 124).",
)
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


def register(group: click.Group) -> None:
    group.add_command(cluster)
