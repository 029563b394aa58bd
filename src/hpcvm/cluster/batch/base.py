"""What a cluster job asks of the batch system it runs under, as one small interface.

hpcvm adds no cluster manager of its own: the batch system places the work. A cluster
job needs five things from it, and nothing else in ``cluster/`` knows which batch system
answers them (ReFrame's scheduler/launcher split is the model):

- the **allocation** this process runs in: a job id and its nodes, in the batch
  system's order (node 0 is the batch node, where ``cluster up`` runs);
- a **step**: one task per node running the same argv, each task's standard output
  relayed to the step's own as it comes (the nodes' event lines), the other tasks ended
  when one fails, and the whole step ended when the job ends;
- **this task's place** in a step: its node, its index, the job and the step;
- **ending a step** with a signal (or outright);
- the **environment of a native MPI launch** on the batch node that spreads its ranks
  over the allocation (Open MPI reads Slurm's variables, for example).

Batch systems are a registry (``cluster/batch/registry.py``, ``BATCH_SYSTEMS``): Slurm
(``batch/slurm.py``) for clusters, ``local`` (``batch/local.py``) for one workstation,
and whatever a plugin registers. A batch system is named in ``cluster up --batch`` and recorded with
the cluster, so ``ps``, ``exec`` and ``down`` use the same one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Allocation:
    """The job this process runs in: its batch system, id and nodes in the batch
    system's order."""

    batch: str
    job_id: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class TaskPlace:
    """Where one task of a step runs: the node's name, its index in the job, the job and
    the step (an id the batch system can end again with ``signal_step``)."""

    node: str
    index: int
    job_id: str
    step: str


class BatchSystem(Protocol):
    """One batch system (module doc). Every method either answers or raises an
    HpcvmError whose one line says what to do."""

    name: str
    submit_hint: str  # how a user gets an allocation, for messages: "sbatch -N NODES"
    # every node is this one host (``local``): a process cannot tell its node from where
    # it runs, so an MPI rank's node is the one --map-by node deals it to
    nodes_share_this_host: bool

    def allocation(self, nodes: int | None, env: Mapping[str, str]) -> Allocation:
        """The allocation ``env`` (this process's environment) runs in. ``nodes``: how
        many nodes the user asked for (``--nodes``), checked against the allocation or,
        where the batch system makes its allocation here, its size."""
        ...

    def task_place(self, env: Mapping[str, str]) -> TaskPlace:
        """This task's place, from the environment the step gave it; UsageError when
        the process was not started by a step."""
        ...

    def step_argv(self, allocation: Allocation, name: str, argv: Sequence[str]) -> list[str]:
        """The command line, run on the batch node, of a step called ``name`` running
        ``argv`` once on every node of ``allocation`` (see the module doc for what a step
        must do). It may be started in a new session: it must not need a terminal."""
        ...

    def find_step(self, allocation: Allocation, name: str) -> str | None:
        """The id of the running step called ``name``; None when there is none (yet)."""
        ...

    def signal_step(self, step: str, signal_name: str | None) -> bool:
        """Send ``signal_name`` (``TERM``, ``KILL``...) to every task of ``step``, or end
        it outright when None; whether the batch system took the request."""
        ...

    def native_mpi_env(self, env: Mapping[str, str]) -> list[str]:
        """``KEY=VALUE`` words a native ``mpirun`` on the batch node needs, beyond a
        clean environment, to start ranks on every node of the allocation."""
        ...

    def this_node(self, env: Mapping[str, str]) -> str:
        """The name of the node this process runs on, as the allocation names it."""
        ...


@runtime_checkable
class Drains(Protocol):
    """What a batch system may also tell: which nodes an admin drains, and a way to
    warn a job's batch script (the keeper's answer to a drain, cluster/commands/keeper.py). A
    batch system without it runs jobs whose keeper watches no drains."""

    def draining(self, nodes: Sequence[str]) -> dict[str, str]:
        """Those of ``nodes`` being drained or drained, each with the admin's reason."""
        ...

    def warn_job(self, job_id: str, signal_name: str) -> bool:
        """Send ``signal_name`` to the job's batch script (as before a time limit);
        whether the batch system took it."""
        ...
