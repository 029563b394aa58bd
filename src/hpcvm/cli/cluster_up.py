"""`hpcvm cluster up`: the one cluster command that starts a job, and all it checks first.

Apart from cluster_cmd.py because it is most of the cluster CLI: a dozen options on top
of the VM options, the checks of the VMs' paths and of --on-drain, the refusal of VM
options with --restore, the choice of a series' newest restorable checkpoint, and the
periodic checkpoints and drain handling it hands to the job's keeper. None of it serves
another command; the one line of output they all share, ``say``, lives here, the module
cluster_cmd.py imports (it imports none back).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from hpcvm.cli.common import parse_duration, say, seconds
from hpcvm.cli.vm_options import require_shape, vm_options_shape_optional
from hpcvm.cluster.batch.registry import BATCH_SYSTEMS, DEFAULT_BATCH
from hpcvm.cluster.tasks.addresses import AUTO
from hpcvm.errors import UsageError
from hpcvm.signals import interrupting, signals_deferred

if TYPE_CHECKING:
    from hpcvm.cluster.job.checkpoint_model import PeriodicCheckpoints
    from hpcvm.runtime.machine.options import VmOptions

DEFAULT_UP_TIMEOUT = 300.0
DEFAULT_NETWORK = "bridge=br0"


@click.command("up")
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
            ready = control.up(request, timeout, say, restore=restore.absolute())
        say(f"{name}: {len(ready)} VM(s) restored and running")
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
        ready = control.up(request, timeout, say)
    say(f"{name}: {len(ready)} VM(s) up")
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
            control.down(name, say)
        raise
    if periodic is not None:
        say(
            f"{name}: a checkpoint every {keeper.interval_text(periodic.every)} into "
            f"{periodic.directory} "
            f"(keeping the newest {periodic.keep}; log {periodic.directory}/{keeper.LOG})"
        )
    if on_drain != "none":
        say(f"{name}: a node that drains: {on_drain} (the keeper, pid {pid}, asks every "
             f"{keeper.DRAIN_POLL:g} s)")  # fmt: skip


def _restorable(directory: Path) -> Path:
    """``--restore DIR``: a job checkpoint, or a series of periodic ones (its newest
    complete one that reads back whole)."""
    from hpcvm.cluster.job import checkpoint_series

    if not checkpoint_series.is_series(directory):
        return directory
    chosen = checkpoint_series.newest_restorable(directory, say=lambda m: say(f"--restore: {m}"))
    say(f"--restore: the newest complete checkpoint of {directory} is {chosen.name}")
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
