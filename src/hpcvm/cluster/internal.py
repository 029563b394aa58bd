"""The processes a cluster job starts of hpcvm itself, all started one way::

    python -m hpcvm.cluster.internal ROLE ARGS...

- ``node``: one task of the holder step: the VM of one node (tasks/node.py);
- ``placement CONFIG_JSON``: one task of a ``bench --nodes`` step: this node's native
  placement, as a JSON line (benchnodes/native_places.py);
- ``holder STATE_DIR STEP_ARGV...``: runs the holder step on the batch node and removes
  the cluster's state when it ends (commands/holder.py);
- ``reaper VM_NAME``: takes a node's VM down when its task dies (tasks/reaper.py);
- ``local-step JOB NAME NODES ARGV...``: a step of the ``local`` batch system (batch/local.py);
- ``container-node SPEC_JSON``: one task of a ``bench --nodes`` step holding this node's
  benchmark container (benchnodes/containers.py);
- ``container-rank SPEC_JSON ARGV...``: one MPI rank entering its node's container
  (benchnodes/containers.py);
- ``migrate-source REQUEST_JSON``: the one task of a ``cluster migrate`` step on the
  VM's node: sends the VM to a spare node (tasks/migrate_node.py).
- ``migrate-settle REQUEST_JSON``: the one task of a step on that node when the source
  step died after it said go: the paused copy marked moved, or resumed (tasks/migrate_node.py).
- ``checkpoint-node PHASE_JSON``: one task of a ``cluster checkpoint`` phase: check,
  pause, save or resume this node's VM (tasks/checkpoint_node.py).
- ``keeper NAME PLAN_JSON``: on the batch node, checkpoints the job at an interval
  (``cluster up --checkpoint-every``, commands/keeper.py).

Why one module and not hidden CLI commands: these are not commands a user runs, and
each must start with the same interpreter and package as the process that starts it
(batch/spawn.py). Like the CLI, each loads the configured plugins first (a plugin's batch
system or network kind must exist in every task; ``HPCVM_PLUGINS`` reaches them in the
environment) and ends an ``HpcvmError`` with its one line and exit code, never a
traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from hpcvm.cluster.batch.spawn import INTERNAL_MODULE
from hpcvm.errors import HpcvmError, UsageError


def _node(args: list[str]) -> int:
    from hpcvm.cluster.tasks import node

    _no_more(args, "node")
    return node.run()


def _placement(args: list[str]) -> int:
    from hpcvm.cluster.benchnodes import native_places

    if len(args) != 1:
        raise UsageError("placement takes one argument: the bench configuration as JSON")
    sys.stdout.write(native_places.this_node(args[0]) + "\n")
    return 0


def _holder(args: list[str]) -> int:
    from hpcvm.cluster.commands import holder

    if len(args) < 2:
        raise UsageError("holder takes the state directory and the step's command line")
    os.umask(0o077)
    return holder.main(args)


def _reaper(args: list[str]) -> int:
    from hpcvm.cluster.tasks import reaper

    if len(args) != 1:
        raise UsageError("reaper takes one argument: the VM's name")
    return reaper.main(args)


def _local_step(args: list[str]) -> int:
    from hpcvm.cluster.batch import local

    if len(args) < 4:
        raise UsageError("local-step takes the job, the step's name, its nodes and a command")
    job, name, nodes, *argv = args
    return local.run_step(job, name, nodes, argv)


def _container_node(args: list[str]) -> int:
    from hpcvm.cluster.benchnodes import containers as bench_containers

    if len(args) != 1:
        raise UsageError("container-node takes one argument: the node specification as JSON")
    return bench_containers.node_main(args[0])


def _container_rank(args: list[str]) -> int:
    from hpcvm.cluster.benchnodes import containers as bench_containers

    if not args:
        raise UsageError("container-rank takes the rank specification and a command")
    return bench_containers.rank_main(args[0], args[1:])


def _checkpoint_node(args: list[str]) -> int:
    from hpcvm.cluster.tasks import checkpoint_node

    if len(args) != 1:
        raise UsageError("checkpoint-node takes one argument: the phase as JSON")
    return checkpoint_node.run(args[0])


def _keeper(args: list[str]) -> int:
    from hpcvm.cluster.commands import keeper

    if len(args) != 2:
        raise UsageError("keeper takes the cluster's name and its checkpoint plan as JSON")
    os.umask(0o077)
    return keeper.run(args[0], args[1])


def _migrate_source(args: list[str]) -> int:
    from hpcvm.cluster.tasks import migrate_node

    if len(args) != 1:
        raise UsageError("migrate-source takes one argument: the request as JSON")
    return migrate_node.run_source(args[0])


def _migrate_settle(args: list[str]) -> int:
    from hpcvm.cluster.tasks import migrate_node

    if len(args) != 1:
        raise UsageError("migrate-settle takes one argument: the request as JSON")
    return migrate_node.run_settle(args[0])


def _no_more(args: list[str], role: str) -> None:
    if args:
        raise UsageError(f"{role} takes no arguments")


ROLES: dict[str, Callable[[list[str]], int]] = {
    "node": _node,
    "placement": _placement,
    "holder": _holder,
    "reaper": _reaper,
    "local-step": _local_step,
    "container-node": _container_node,
    "container-rank": _container_rank,
    "checkpoint-node": _checkpoint_node,
    "migrate-source": _migrate_source,
    "migrate-settle": _migrate_settle,
    "keeper": _keeper,
}


# Roles that load the plugins themselves, when they need them: the reaper starts beside
# its node's VM and then waits, maybe for days; scanning the installed packages' entry
# points then would only take CPU from the VM's boot (tasks/reaper.py).
LATE_PLUGINS = frozenset({"reaper"})


def main(argv: list[str]) -> int:
    """Run one role; its exit code."""
    if not argv or argv[0] not in ROLES:
        sys.stderr.write(
            f"hpcvm: error: {INTERNAL_MODULE} runs one of {', '.join(ROLES)}: it is started by "
            "hpcvm cluster and bench --nodes, not by hand\n"
        )
        return UsageError.exit_code
    try:
        if argv[0] not in LATE_PLUGINS:
            from hpcvm.plugins import load_plugins

            load_plugins()
        return ROLES[argv[0]](argv[1:])
    except HpcvmError as exc:
        sys.stderr.write(f"hpcvm: error: {exc}\n")
        sys.stderr.flush()
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("hpcvm: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
