"""What hpcvm asks of Slurm: the allocation it runs in, one step that holds the VMs,
and the signals that end it.

Why a step holds the VMs rather than daemons left behind by a short step: Slurm ends a
step's processes when the step ends (with proctrack/cgroup it kills the whole cgroup),
and it ends every step of a job on ``scancel`` or when the job ends. A VM owned by a
running step therefore goes down exactly when Slurm says the job is over, on every node,
without hpcvm keeping its own list of hosts to visit. ``--overlap`` lets the job's other
steps (the user's MPI runs, native benchmark runs) share the nodes with it;
``--cpu-bind=none`` keeps Slurm's task affinity off QEMU, which hpcvm pins itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcvm.errors import RuntimeFailure, UsageError

SLURM_PACKAGE = "slurm-client"


@dataclass(frozen=True)
class Allocation:
    """The Slurm job this process runs in: its id and its nodes in Slurm's order."""

    job_id: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class TaskPlace:
    """Where one task of a step runs: the node's name, its index in the job, the step."""

    node: str
    index: int
    job_id: str
    step: str


def program(name: str) -> str:
    """A Slurm command's path; RuntimeFailure naming the package when missing."""
    found = shutil.which(name)
    if found is None:
        raise RuntimeFailure(f"{name} not found: install Slurm's client ({SLURM_PACKAGE})")
    return found


def current_allocation(env: Mapping[str, str] | None = None) -> Allocation:
    """The allocation named by Slurm's environment; UsageError outside one."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise UsageError(
            "hpcvm cluster runs inside a Slurm allocation (no SLURM_JOB_ID here): submit "
            "the commands in a batch script with sbatch -N NODES, or under salloc -N NODES"
        )
    return Allocation(job_id=job, nodes=hostnames(nodelist))


def hostnames(nodelist: str) -> tuple[str, ...]:
    """A Slurm node list (``node[1-3],gpu7``) expanded by Slurm itself."""
    done = subprocess.run(
        [program("scontrol"), "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    names = tuple(done.stdout.split())
    if done.returncode != 0 or not names:
        raise RuntimeFailure(
            f"scontrol show hostnames {nodelist} failed: {done.stderr.strip() or 'no names'}"
        )
    return names


def task_place(env: Mapping[str, str] | None = None) -> TaskPlace:
    """This task's node, index and step, from the variables slurmstepd sets."""
    env = os.environ if env is None else env
    try:
        return TaskPlace(
            node=env["SLURMD_NODENAME"],
            index=int(env["SLURM_NODEID"]),
            job_id=env["SLURM_JOB_ID"],
            step=f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}",
        )
    except (KeyError, ValueError) as exc:
        raise UsageError(
            "hpcvm cluster node is started by hpcvm cluster up (through srun), not by hand"
        ) from exc


def holder_argv(allocation: Allocation, name: str, node_argv: Sequence[str]) -> list[str]:
    """The srun line of the step that holds the job's VMs: one task per node."""
    return per_node_argv(allocation, step_name(name), node_argv)


def per_node_argv(allocation: Allocation, job_name: str, node_argv: Sequence[str]) -> list[str]:
    """An srun line running ``node_argv`` once on every node of the job, beside its
    other steps, without Slurm's CPU binding."""
    count = len(allocation.nodes)
    return [
        program("srun"),
        f"--jobid={allocation.job_id}",
        f"--nodes={count}",
        f"--ntasks={count}",
        "--ntasks-per-node=1",
        "--overlap",
        "--cpu-bind=none",
        "--kill-on-bad-exit=1",
        "--unbuffered",
        f"--job-name={job_name}",
        *node_argv,
    ]


def find_step(job_id: str, step_name: str) -> str | None:
    """The id (JOB.STEP) of the job's running step named ``step_name``, as squeue
    lists it; None when there is none (yet)."""
    done = subprocess.run(
        [program("squeue"), "--steps", f"--jobs={job_id}", "--noheader", "--format=%i %j"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    for line in done.stdout.splitlines():
        step, _, name = line.strip().partition(" ")
        if name == step_name:
            return step
    return None


def step_name(cluster: str) -> str:
    """The holder step's name (``srun --job-name``), by which it is found again."""
    return f"hpcvm-cluster-{cluster}"


def signal_step(step: str, signal_name: str | None = "TERM") -> bool:
    """``scancel`` one step (with a signal, or outright); whether Slurm accepted it."""
    argv = [program("scancel"), "--quiet"]
    if signal_name is not None:
        argv.append(f"--signal={signal_name}")
    done = subprocess.run([*argv, step], capture_output=True, text=True, check=False, timeout=60)
    return done.returncode == 0
