"""`hpcvm cluster wait`: collect a detached command's output, and say what befalls the
job meanwhile.

Apart from cluster_cmd.py because the wait is more than a call: while the command runs
it relays the job's periodic checkpoints and settled moves, and a lost node ends it with
exit 11 naming where the work survives, after looking again for the events that reach
the batch node a little after the failure the wait met. Those helpers serve the wait
alone.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcvm.cli.common import seconds
from hpcvm.errors import NodeLost, RuntimeFailure

if TYPE_CHECKING:
    from hpcvm.cluster.commands.control import JobWatch
    from hpcvm.cluster.job.checkpoint_model import PeriodicCheckpoints


@click.command("wait")
@click.argument("name")
@click.argument("command_id", metavar="[ID]", type=int, required=False)
@click.option(
    "--timeout",
    callback=seconds,
    metavar="SECONDS",
    default=None,
    help="Seconds before giving up (exit 124; the command runs on).",
)
def wait_cmd(name: str, command_id: int | None, timeout: float | None) -> int:
    """Wait for a command cluster exec --detach started; print its output, exit with its
    exit status. ID may be left out when there is one. A job that loses a node's VM
    meanwhile ends the wait with exit 11, naming the node and the job's newest complete
    checkpoint (a requeued job restores it); its periodic checkpoints are said as they
    are taken."""
    from hpcvm.cluster.commands import control, detached
    from hpcvm.cluster.job import state
    from hpcvm.runtime.machine.model import ExecResult
    from hpcvm.runtime.vm.guest_exec import ExecTimeout

    def report(result: ExecResult) -> None:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        sys.stdout.flush()
        sys.stderr.flush()

    plan = state.read_record(name).periodic
    watch = control.JobWatch(name)
    news = _periodic_news(name, plan)

    def meanwhile() -> None:
        news()
        lost = watch.lost()
        for line in watch.moves:  # a move (by cluster migrate, off a drained node, or
            # one whose source step died, settled by a node's task)
            click.echo(f"hpcvm: {line}", err=True)
        watch.moves.clear()
        if lost is not None:
            raise _node_lost(name, lost, plan)

    try:
        return detached.wait_detached(name, command_id, timeout, report, meanwhile).exit_code
    except (RuntimeFailure, OSError) as exc:  # the first VM's agent gone with its node
        if isinstance(exc, ExecTimeout):
            raise
        lost = _settled(watch)
        if lost is None:
            raise
        raise _node_lost(name, lost, plan) from exc


def _settled(watch: JobWatch, seconds: float = 10.0) -> str | None:
    """What the job lost, looking again for a while: the events that say so reach the
    batch node a little after the failure the wait met."""
    deadline = time.monotonic() + seconds
    while (lost := watch.lost()) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return lost


def _node_lost(name: str, lost: str, plan: PeriodicCheckpoints | None) -> NodeLost:
    """The one line for a job that lost a VM: what, and where its work survives."""
    from hpcvm.cluster.job import checkpoint_series

    newest = checkpoint_series.complete(Path(plan.directory)) if plan is not None else []
    if newest:
        where = (
            f"its newest complete checkpoint is {newest[-1]}: requeue the job and restore it "
            f"(cluster up --restore {plan.directory if plan else newest[-1]})"
        )
    else:
        where = "it has no complete checkpoint (cluster up --checkpoint-every takes them)"
    return NodeLost(f"cluster {name} lost a VM while its program ran ({lost}); {where}")


def _periodic_news(name: str, plan: PeriodicCheckpoints | None) -> Callable[[], None]:
    """For cluster wait: each periodic checkpoint of the job, said on stderr as it is
    recorded (the job's output then shows what each cost, or why it failed)."""
    from hpcvm.cluster.commands import keeper

    if plan is None:
        return lambda: None
    series = Path(plan.directory)
    seen = len(keeper.history(series))

    def news() -> None:
        nonlocal seen
        taken = keeper.history(series)
        for one in taken[seen:]:
            click.echo(f"hpcvm: {keeper.describe(name, one)}", err=True)
        seen = max(seen, len(taken))

    return news
