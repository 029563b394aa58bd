"""`hpcvm cluster up|ps|exec|wait|checkpoint|migrate|down`: tuned VMs on every node of a batch job.

Thin: options become a ClusterRequest, hpcvm/cluster/ does the work. Run inside an
allocation (a batch script under ``sbatch -N N``, or ``salloc``), on its first node, or
on one machine with ``--batch local --nodes N``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from hpcvm.cli.common import console, err_console, parse_duration, seconds
from hpcvm.cli.vm_options import require_shape, vm_options_shape_optional
from hpcvm.cluster.batch.registry import BATCH_SYSTEMS, DEFAULT_BATCH
from hpcvm.cluster.tasks.addresses import AUTO
from hpcvm.errors import NodeLost, RuntimeFailure, UsageError
from hpcvm.signals import interrupting, signals_deferred

if TYPE_CHECKING:
    from hpcvm.cluster.commands.control import JobWatch
    from hpcvm.cluster.job.checkpoint_model import PeriodicCheckpoints
    from hpcvm.runtime.machine.options import VmOptions

DEFAULT_UP_TIMEOUT = 300.0
DEFAULT_NETWORK = "bridge=br0"
WIDE = 240  # columns of `cluster ps` when not on a terminal


def _say(text: str) -> None:
    err_console.print(text, highlight=False, markup=False)


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
@click.option(
    "--spare",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Keep the allocation's last K nodes free of VMs, for cluster migrate.",
)
@vm_options_shape_optional
@click.option(
    "--timeout",
    type=str,
    callback=seconds,
    metavar="SECONDS",
    default=DEFAULT_UP_TIMEOUT,
    show_default=True,
    help="Seconds for every VM to come up before all are taken down.",
)
@click.option(
    "--restore",
    "restore",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="Restore the VMs of a job checkpoint (cluster checkpoint) instead, one per node "
    "in node order, each re-planned for its node; the VM options are the checkpoint's.",
)
@click.option(
    "--checkpoint-every",
    "checkpoint_every",
    default=None,
    metavar="DURATION",
    help="Save the whole job every DURATION (90s, 30m, 2h) while it runs, into a new "
    "directory of --checkpoint-dir; a job requeued after a node failure restores the "
    "newest with --restore DIR (docs/checkpoint.md).",
)
@click.option(
    "--checkpoint-dir",
    "checkpoint_dir",
    type=click.Path(path_type=Path),
    default=None,
    metavar="DIR",
    help="Where --checkpoint-every's checkpoints go (made if missing; on a file system "
    "every node shares).",
)
@click.option(
    "--checkpoint-keep",
    "checkpoint_keep",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="How many complete periodic checkpoints to keep (the newest).",
)
@click.option(
    "--on-drain",
    "on_drain",
    type=click.Choice(["none", "migrate", "checkpoint"]),
    default="none",
    show_default=True,
    help="When the admin drains one of the job's nodes: migrate moves its VM to a spare "
    "node (--spare; with none left, as checkpoint); checkpoint sends the batch script "
    "SIGUSR1, as before a time limit (docs/examples/hpcvm-checkpoint-job.sh saves the job "
    "and requeues it).",
)
def up_cmd(
    name: str,
    batch: str,
    nodes: int | None,
    spare: int,
    timeout: float,
    restore: Path | None,
    checkpoint_every: str | None,
    checkpoint_dir: Path | None,
    checkpoint_keep: int,
    on_drain: str,
    **kw: Any,
) -> int:
    """Start one VM per node of this allocation; return when every guest answers.

    --network is each node's (default bridge=br0). --address auto gives each VM an
    address of the site's pool derived from its node's own (/etc/hpcvm/site.toml);
    --address IP/PREFIX is the first node's VM's, and the k-th node's VM gets the k-th
    next one. Either way each guest checks its address is free on the segment first.
    With --image each VM boots that disk image (with openssh-server, Open MPI and
    qemu-guest-agent in it): such a job can be checkpointed (docs/checkpoint.md).
    """
    from hpcvm.cli.vm_values import VmOptionValues
    from hpcvm.cluster.commands import control
    from hpcvm.cluster.job.spec import ClusterRequest
    from hpcvm.runtime.net.network import parse_address

    periodic = _periodic(checkpoint_every, checkpoint_dir, checkpoint_keep)
    _check_drains(batch, on_drain)
    if restore is not None:
        _refuse_vm_options(kw)
        restore = _restorable(restore)
        request = control.restore_request(restore, name, batch, nodes, os.getcwd(), spare)
        with interrupting():
            ready = control.up(request, timeout, _say, restore=restore.absolute())
        _say(f"{name}: {len(ready)} VM(s) restored and running")
        _start_keeper(name, periodic, on_drain)
        return 0
    require_shape(kw)
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
    _check_vm_paths(vm)
    request = ClusterRequest(
        plan=values.plan_request(),
        vm=vm,
        name=name,
        batch=batch,
        nodes=nodes,
        first_address=values.address,
        workdir=os.getcwd(),
        spare=spare,
    )
    with interrupting():
        ready = control.up(request, timeout, _say)
    _say(f"{name}: {len(ready)} VM(s) up")
    _start_keeper(name, periodic, on_drain)
    return 0


def _periodic(every: str | None, directory: Path | None, keep: int) -> PeriodicCheckpoints | None:
    """The periodic checkpoints asked for, their directory checked before anything
    starts (made once the VMs run); None without --checkpoint-every."""
    from hpcvm.cluster.commands import keeper
    from hpcvm.cluster.job import checkpoint_series
    from hpcvm.cluster.job.checkpoint_model import PeriodicCheckpoints

    if every is None:
        if directory is not None:
            raise UsageError("--checkpoint-dir is for --checkpoint-every: give both, or neither")
        return None
    if directory is None:
        raise UsageError(
            "--checkpoint-every needs --checkpoint-dir DIR (on a file system every node "
            "shares): where the checkpoints go"
        )
    seconds = parse_duration(every, "--checkpoint-every")
    if seconds is None or seconds < keeper.MIN_EVERY:
        raise UsageError(
            f"--checkpoint-every {every!r}: give an interval of at least "
            f"{keeper.MIN_EVERY:g} s, e.g. 30m"
        )
    series = checkpoint_series.prepare(directory, make=False)
    return PeriodicCheckpoints(every=seconds, directory=str(series), keep=keep)


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


def _check_drains(batch: str, on_drain: str) -> None:
    from hpcvm.cluster.batch.base import Drains
    from hpcvm.cluster.batch.registry import get_batch

    if on_drain != "none" and not isinstance(get_batch(batch), Drains):
        raise UsageError(
            f"--on-drain {on_drain}: the {batch} batch system tells no node drains; use it "
            "with a batch system that does (slurm), or leave it out"
        )


def _start_keeper(name: str, periodic: PeriodicCheckpoints | None, on_drain: str) -> None:
    """The job's keeper (cluster/commands/keeper.py), when it has something to do; a failure to
    start it takes the job down (a job asked to be kept is not left unkept)."""
    from hpcvm.cluster.commands import keeper
    from hpcvm.cluster.job import checkpoint_series
    from hpcvm.cluster.job.state import OnDrain

    if periodic is None and on_drain == "none":
        return
    try:
        if periodic is not None:
            checkpoint_series.prepare(Path(periodic.directory))
        plan = keeper.KeeperPlan(periodic=periodic, on_drain=cast(OnDrain, on_drain))
        pid = keeper.start(name, plan)
    except BaseException:
        from hpcvm.cluster.commands import control

        with signals_deferred():
            control.down(name, _say)
        raise
    if periodic is not None:
        _say(
            f"{name}: a checkpoint every {keeper.interval_text(periodic.every)} into "
            f"{periodic.directory} "
            f"(keeping the newest {periodic.keep}; log {periodic.directory}/{keeper.LOG})"
        )
    if on_drain != "none":
        _say(f"{name}: a node that drains: {on_drain} (the keeper, pid {pid}, asks every "
             f"{keeper.DRAIN_POLL:g} s)")  # fmt: skip


def _restorable(directory: Path) -> Path:
    """``--restore DIR``: a job checkpoint, or a series of periodic ones (its newest
    complete one that reads back whole)."""
    from hpcvm.cluster.job import checkpoint_series

    if not checkpoint_series.is_series(directory):
        return directory
    chosen = checkpoint_series.newest_restorable(directory, say=lambda m: _say(f"--restore: {m}"))
    _say(f"--restore: the newest complete checkpoint of {directory} is {chosen.name}")
    return chosen


def _check_vm_paths(vm: VmOptions) -> None:
    """What every node's ``up`` would refuse about the VM's paths (``--share``,
    ``--kernel``, ``--initrd``, ``--image``), refused here, in one line and before any
    node starts: this is the first node, and a job's paths are the same on every node.
    Without it a bad path came back from each node as its VM failing to start (exit 5)."""
    from hpcvm.guest.disk import check_image
    from hpcvm.guest.kernel import kernel_release
    from hpcvm.runtime.backends.registry import get_backend
    from hpcvm.runtime.hostside.shares import parse_shares, reachable

    for flag, path in (("--kernel", vm.kernel), ("--initrd", vm.initrd), ("--image", vm.image)):
        problem = None if path is None else _unreadable_file(path)
        if problem is not None:
            raise UsageError(f"{flag} {path}: {problem}; give a file you may read")
    if vm.image is not None and (vm.kernel or vm.initrd):  # as runtime/vm/boot.py pairs them
        raise UsageError("give either --image or --kernel/--initrd, not both")
    if vm.initrd is not None and vm.kernel is None:
        raise UsageError("--initrd needs --kernel")
    if vm.kernel is not None:
        kernel_release(Path(vm.kernel))  # refuses a file that is not a kernel
    if vm.image is not None:
        check_image(vm.image)
    requests = parse_shares(vm.shares)
    if requests:
        backend = get_backend(vm.backend, vm.connect_uri)
        user = backend.qemu_user()
        reachable(requests, user, opened_by_root=backend.opens_shares_as_root and user.switch)


def _unreadable_file(path: str) -> str | None:
    """Why this user cannot read the file ``path``, or None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "it does not exist"
    except OSError as exc:
        return f"it cannot be reached ({os.strerror(exc.errno or 0)})"
    if not stat.S_ISREG(mode):
        return "it is not a file"
    return None if os.access(path, os.R_OK) else "it is not readable by you"


def _refuse_vm_options(kw: dict[str, Any]) -> None:
    """A restore runs the saved VMs: any VM option given with it is refused."""
    ctx = click.get_current_context()
    given = [
        f"--{k.replace('_', '-')}"
        for k in kw
        if ctx.get_parameter_source(k) is click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        raise UsageError(
            f"{', '.join(given)} cannot be given with --restore: the restored VMs are the "
            "saved ones (their plan is made again for each node); drop them"
        )


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
        _say(f"hpcvm: cluster {name} ended while its job ran: {state.ended_note(name)}")
        state.forget_ended(name)
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
        _say(f"{name}: started as {started.pid}; hpcvm cluster wait {name} {started.pid}")
        return 0
    from hpcvm.cluster.commands.first_vm import exec_first  # no models (its module doc)

    result = exec_first(name, argv, os.getcwd(), timeout)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.exit_code


@cluster.command("wait")
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
            name, directory, resume_after=resume, say=_say, in_series=in_series
        )
    if in_series:
        for path in checkpoint_series.prune(directory, keep):
            _say(f"{name}: removed {path} (keeping the newest {keep})")
    size = sum(r.state_bytes + r.disk_bytes for r in saved.results)
    how = "paused for" if resume else "paused until saved for"
    _say(
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
        moved = migrate.migrate(name, node, to, say=_say)
    sent = moved.sent
    where = f"{name}: {moved.vm} moved from {moved.source} to {moved.target} as "
    where += f"{moved.arrived.vm} at {moved.arrived.address}"
    if sent.downtime_ms is None:  # its source step died after go: settled (migrate.py)
        _say(f"{where}, but {moved.stood_still()}")
        return 0
    downtime, disk = sent.downtime_ms, sent.disk_ms or 0.0
    _say(
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

    control.down(name, _say)
    _say(f"{name}: down")
    return 0


def register(group: click.Group) -> None:
    group.add_command(cluster)
