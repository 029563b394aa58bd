"""Slurm as a batch system (batch/base.py): the allocation, one step that holds the VMs, and
the signals that end it. The only module of hpcvm that names Slurm's commands and
variables.

Why a step holds the VMs rather than daemons left behind by a short step: Slurm ends a
step's processes when the step ends (with proctrack/cgroup it kills the whole cgroup),
and it ends every step of a job on ``scancel`` or when the job ends. A VM owned by a
running step therefore goes down exactly when Slurm says the job is over, on every node,
without hpcvm keeping its own list of hosts to visit. ``--overlap`` lets the job's other
steps (the user's MPI runs, native benchmark runs) share the nodes with it;
``--cpu-bind=none`` keeps Slurm's task affinity off QEMU, which hpcvm pins itself;
``--nodelist`` names the step's nodes (a job's spare nodes, cluster migrate, run none
of its VMs' phases);
``--kill-on-bad-exit`` ends every task when one fails; ``--unbuffered`` relays each
task's output line as it comes.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence

from hpcvm.cluster.batch.base import Allocation, TaskPlace
from hpcvm.errors import RuntimeFailure, UsageError

SLURM_PACKAGE = "slurm-client"
VARIABLE_PREFIX = "SLURM_"


def program(name: str) -> str:
    """A Slurm command's path; RuntimeFailure naming the package when missing."""
    found = shutil.which(name)
    if found is None:
        raise RuntimeFailure(f"{name} not found: install Slurm's client ({SLURM_PACKAGE})")
    return found


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


class Slurm:
    """The batch system of most HPC clusters."""

    name = "slurm"
    submit_hint = "submit the commands in a batch script with sbatch -N NODES, or under salloc"
    nodes_share_this_host = False

    def allocation(self, nodes: int | None, env: Mapping[str, str]) -> Allocation:
        job = env.get("SLURM_JOB_ID")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not job or not nodelist:
            raise UsageError(
                "hpcvm cluster runs inside a Slurm allocation (no SLURM_JOB_ID here): "
                f"{self.submit_hint} (or give --batch local to run on this machine alone)"
            )
        found = Allocation(batch=self.name, job_id=job, nodes=hostnames(nodelist))
        if nodes is not None and nodes != len(found.nodes):
            raise UsageError(
                f"--nodes {nodes} but this Slurm allocation has {len(found.nodes)} node(s): "
                f"submit with -N {nodes}"
            )
        return found

    def task_place(self, env: Mapping[str, str]) -> TaskPlace:
        try:
            return TaskPlace(
                node=env["SLURMD_NODENAME"],
                index=int(env["SLURM_NODEID"]),
                job_id=env["SLURM_JOB_ID"],
                step=f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}",
            )
        except (KeyError, ValueError) as exc:
            raise UsageError(
                "this command is one task of a Slurm step that hpcvm starts itself "
                "(cluster up, bench --nodes), not a command to run by hand"
            ) from exc

    def step_argv(self, allocation: Allocation, name: str, argv: Sequence[str]) -> list[str]:
        count = len(allocation.nodes)
        return [
            program("srun"),
            f"--jobid={allocation.job_id}",
            f"--nodes={count}",
            f"--nodelist={','.join(allocation.nodes)}",
            f"--ntasks={count}",
            "--ntasks-per-node=1",
            "--overlap",
            "--cpu-bind=none",
            "--kill-on-bad-exit=1",
            "--unbuffered",
            f"--job-name={name}",
            *argv,
        ]

    def find_step(self, allocation: Allocation, name: str) -> str | None:
        done = subprocess.run(
            [
                program("squeue"),
                "--steps",
                f"--jobs={allocation.job_id}",
                "--noheader",
                "--format=%i %j",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        for line in done.stdout.splitlines():
            step, _, step_name = line.strip().partition(" ")
            if step_name == name:
                return step
        return None

    def signal_step(self, step: str, signal_name: str | None) -> bool:
        argv = [program("scancel"), "--quiet"]
        if signal_name is not None:
            argv.append(f"--signal={signal_name}")
        done = subprocess.run(
            [*argv, step], capture_output=True, text=True, check=False, timeout=60
        )
        return done.returncode == 0

    def native_mpi_env(self, env: Mapping[str, str]) -> list[str]:
        """Open MPI's mpirun finds the allocation through Slurm's variables and starts
        its daemons with srun."""
        return [f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(VARIABLE_PREFIX)]

    def this_node(self, env: Mapping[str, str]) -> str:
        return env.get("SLURMD_NODENAME") or socket.gethostname()

    def draining(self, nodes: Sequence[str]) -> dict[str, str]:
        """``scontrol show node --oneliner``: a node whose state carries the DRAIN flag
        (draining while jobs run, drained after), with its Reason. A node Slurm cannot
        be asked about counts as not draining (the keeper asks again soon)."""
        if not nodes:
            return {}
        done = subprocess.run(
            [program("scontrol"), "show", "node", "--oneliner", ",".join(nodes)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        return parse_draining(done.stdout) if done.returncode == 0 else {}

    def warn_job(self, job_id: str, signal_name: str) -> bool:
        argv = [program("scancel"), "--quiet", "--batch", f"--signal={signal_name}", job_id]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        return done.returncode == 0


_FIELD = re.compile(r"(?:^|\s)(\w+)=")


def parse_draining(text: str) -> dict[str, str]:
    """Node -> reason of every node in ``scontrol show node --oneliner`` output whose
    State has the DRAIN flag (``IDLE+DRAIN``, ``MIXED+DRAIN``, ``DRAINING``...). The
    Reason runs to the next field (it may hold spaces)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        marks = list(_FIELD.finditer(line))
        ends = [m.start() for m in marks[1:]] + [len(line)]
        fields = {
            m.group(1): line[m.end() : end].strip() for m, end in zip(marks, ends, strict=True)
        }
        state = fields.get("State", "")
        if fields.get("NodeName") and "DRAIN" in state.upper():
            found[fields["NodeName"]] = fields.get("Reason", "")
    return found
