"""`hpcvm cluster up|ps|exec|wait|checkpoint|migrate|down`: tuned VMs on every node of a batch job.

Thin: options become a ClusterRequest, hpcvm/cluster/ does the work. Run inside an
allocation (a batch script under ``sbatch -N N``, or ``salloc``), on its first node, or
on one machine with ``--batch local --nodes N``.

This module holds the group, ``register`` and the commands that are a call and a few
lines of output; ``up`` (cluster_up.py) and ``wait`` (cluster_wait.py) live apart, each
with the checks and helpers only it uses.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcvm.cli.cluster_up import up_cmd
from hpcvm.cli.cluster_wait import wait_cmd
from hpcvm.cli.common import console, say, seconds
from hpcvm.errors import UsageError
from hpcvm.signals import interrupting

if TYPE_CHECKING:
    from hpcvm.cluster.job.checkpoint_model import PeriodicCheckpoints

WIDE = 240  # columns of `cluster ps` when not on a terminal


@click.group("cluster")
def cluster() -> None:
    """Tuned VMs on every node of a batch job, joined by a network, running MPI;
    checkpoint the whole job and restore it on other nodes.

    In a batch script (sbatch -N 2): cluster up starts one VM per allocated node, each
    planned for its node; cluster exec runs a command (mpirun) in the first VM with
    ranks on every VM (--detach, then cluster wait); cluster ps lists them; cluster
    down stops them all. scancel or the job's end stops them too. cluster checkpoint
    saves every VM of a job booted from a disk image (--image), and cluster up
    --restore starts them again in a later job; cluster migrate moves one node's VM to
    a spare node (cluster up --spare) while it runs. On one machine: cluster up --batch
    local --nodes N.
    """


cluster.add_command(up_cmd)
cluster.add_command(wait_cmd)


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

    from hpcvm.cluster.commands import control
    from hpcvm.cluster.job.spec import spare_nodes
    from hpcvm.cluster.job.state import events

    record, latest, alive = control.status(name)
    listening = spare_nodes(events(name))
    gone = "starting" if alive else "gone"
    spares = {n: "spare" if n in listening else gone for n in record.spare}
    if as_json:
        rows = [e.model_dump(exclude={"step"}) for e in latest]
        data: dict[str, Any] = {"name": name, "job": record.job_id, "holder": alive}
        data |= {"nodes": rows, "spare": spares}
        data["on_drain"] = record.on_drain
        if record.periodic is not None:
            from hpcvm.cluster.commands.keeper import history

            taken = history(Path(record.periodic.directory))
            data["periodic"] = record.periodic.model_dump()
            data["checkpoints"] = [t.model_dump() for t in taken]
        console.print_json(data=data)
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
    for node, said in spares.items():
        table.add_row(node, "", said, "", "", "", "")
    # Not cut to 80 columns when piped into a batch job's output: every cell whole.
    out = console if console.is_terminal else Console(width=WIDE, emoji=False)
    out.print(table)
    for line in _periodic_lines(name, record.periodic):
        out.print(line, markup=False, highlight=False)
    if record.on_drain != "none":
        out.print(f"a node that drains: {record.on_drain}", markup=False, highlight=False)
    from hpcvm.cluster.job.state import settled_moves

    for line in settled_moves(name):
        out.print(line, markup=False, highlight=False)
    return 0


def _periodic_lines(name: str, plan: PeriodicCheckpoints | None) -> list[str]:
    """What ``ps`` says of a job's periodic checkpoints: the plan, how many were taken
    and failed, the last one, and the stand-still as a share of the interval."""
    from hpcvm.cluster.commands import keeper

    if plan is None:
        return []
    taken = keeper.history(Path(plan.directory))
    ok = [t for t in taken if t.ok]
    lines = [
        f"checkpoints: every {keeper.interval_text(plan.every)} into {plan.directory} (keeping "
        f"{plan.keep}): {len(ok)} saved, {len(taken) - len(ok)} failed"
    ]
    if taken:
        lines.append(f"last: {keeper.describe(name, taken[-1])}")
    if ok:
        still = sum(t.paused_seconds or 0.0 for t in ok) / len(ok)
        lines.append(
            f"the VMs stood still {still:.2f} s per checkpoint on average: "
            f"{100 * still / plan.every:.3g} % of the interval"
        )
    return lines


def _ps_all(as_json: bool) -> int:
    from rich.table import Table

    from hpcvm.cluster.job import state

    rows: list[tuple[str, str, str, tuple[str, ...], str]] = []
    for name in state.ended_names():  # said once, then gone (the job epilog runs this)
        say(f"hpcvm: cluster {name} ended while its job ran: {state.ended_note(name)}")
        state.forget_ended(name)
    for name in state.names():
        if state.remove_if_stale(name):
            say(f"hpcvm: removed the state of cluster {name}: its job has ended")
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
@click.option(
    "--detach",
    is_flag=True,
    help="Start the command and return its id at once; cluster wait collects its output "
    "and exit status later, also after a checkpoint and restore of the job.",
)
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(name: str, timeout: float | None, detach: bool, argv: tuple[str, ...]) -> int:
    """Run a command in the first VM; mpirun there starts ranks on every VM of the job."""
    if detach:
        from hpcvm.cluster.commands import detached

        if timeout is not None:
            raise UsageError("--timeout is for cluster wait when the command is detached")
        started = detached.exec_detached(name, argv, os.getcwd())
        sys.stdout.write(f"{started.pid}\n")
        say(f"{name}: started as {started.pid}; hpcvm cluster wait {name} {started.pid}")
        return 0
    from hpcvm.cluster.commands.first_vm import exec_first  # no models (its module doc)

    result = exec_first(name, argv, os.getcwd(), timeout)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.exit_code


@contextlib.contextmanager
def _made_if_failing(directory: Path | None) -> Iterator[None]:
    """A series directory this command made goes again (when empty) if it fails."""
    try:
        yield
    except BaseException:
        if directory is not None:
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise


@cluster.command("checkpoint")
@click.argument("name")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--resume", is_flag=True, help="Run the VMs on after the save instead of taking them down."
)
@click.option(
    "--series",
    "in_series",
    is_flag=True,
    help="DIRECTORY is a series of checkpoints (made if missing; cluster up "
    "--checkpoint-dir): this one becomes its next member, and once it is complete the "
    "older ones beyond the job's --checkpoint-keep (1 without one) go.",
)
def checkpoint_cmd(name: str, directory: Path, resume: bool, in_series: bool) -> int:
    """Pause every VM of the job, then save them all into DIRECTORY (on a file system
    every node shares), then take them down (or --resume). Restore later, on any nodes:
    cluster up --restore DIRECTORY (a series: its newest complete checkpoint)."""
    from hpcvm.cluster.commands import checkpoint
    from hpcvm.cluster.job import checkpoint_series, state

    keep = 1
    if in_series:
        plan = state.read_record(name).periodic if state.has_record(name) else None
        keep = plan.keep if plan is not None else 1
        made = not directory.exists()
        directory = checkpoint_series.prepare(directory)
    with interrupting(), _made_if_failing(directory if in_series and made else None):
        saved = checkpoint.checkpoint(
            name, directory, resume_after=resume, say=say, in_series=in_series
        )
    if in_series:
        for path in checkpoint_series.prune(directory, keep):
            say(f"{name}: removed {path} (keeping the newest {keep})")
    size = sum(r.state_bytes + r.disk_bytes for r in saved.results)
    how = "paused for" if resume else "paused until saved for"
    say(
        f"{name}: {len(saved.results)} VM(s) saved in {saved.directory} "
        f"({size / 2**20:.1f} MiB); {how} {saved.paused_seconds:.2f} s"
        + ("" if resume else ", then taken down")
    )
    return 0


@cluster.command("migrate")
@click.argument("name")
@click.option("--node", "node", required=True, help="The node whose VM moves.")
@click.option("--to", "to", required=True, help="A spare node of the job (cluster up --spare).")
def migrate_cmd(name: str, node: str, to: str) -> int:
    """Move the VM on --node to the spare node --to while it runs (live migration),
    re-planned there; the guest keeps its address, and the old node becomes a spare."""
    from hpcvm.cluster.commands import migrate

    with interrupting():
        moved = migrate.migrate(name, node, to, say=say)
    sent = moved.sent
    where = f"{name}: {moved.vm} moved from {moved.source} to {moved.target} as "
    where += f"{moved.arrived.vm} at {moved.arrived.address}"
    if sent.downtime_ms is None:  # its source step died after go: settled (migrate.py)
        say(f"{where}, but {moved.stood_still()}")
        return 0
    downtime, disk = sent.downtime_ms, sent.disk_ms or 0.0
    say(
        f"{where}; {moved.stood_still()} ({downtime:.0f} ms QEMU's last pass, {disk:.0f} ms "
        f"its disk overlay), {(sent.total_ms or 0) / 1000:.2f} s in all; "
        f"{sent.state_bytes / 2**20:.1f} MiB RAM and {sent.disk_bytes / 2**20:.1f} MiB disk sent"
    )
    return 0


@cluster.command("down")
@click.argument("name")
def down_cmd(name: str) -> int:
    """Stop every VM of the cluster on every node and remove what hpcvm made."""
    from hpcvm.cluster.commands import control

    control.down(name, say)
    say(f"{name}: down")
    return 0


def register(group: click.Group) -> None:
    group.add_command(cluster)
