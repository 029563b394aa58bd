"""``local``: a batch system of one workstation, for ``hpcvm cluster up --batch local
--nodes N`` (N VMs on this host, joined by a network, running MPI across each other)
without Slurm.

It does what a batch system does for a cluster job (batch/base.py), with processes of this
host:

- the **allocation** is made here: ``--nodes N`` nodes called ``local1`` ... ``localN``,
  all this host, for as long as the **job leader** lives, the process that ran
  ``cluster up`` (the shell or batch script; its pid is in the job id, ``local-PID``).
  When it exits, the job is over and every step ends, as Slurm ends a job's steps when
  its batch script exits. (A leader that is init, pid 1, is not watched.)
- a **step** is a process of its own (``run_step``) starting one task per node, each
  confined by CPU affinity to its node's share of the PUs this process may use (whole
  cores, in order; nodes share PUs only when there are fewer cores than nodes), so each
  node plans its VM on its own PUs as a real node would (the planner honours the
  process's affinity like a cgroup cpuset). It relays the tasks' output lines as they
  come, ends every task with SIGTERM when one fails (Slurm's ``--kill-on-bad-exit``),
  when it is signalled itself, or when the leader exits, and exits with the first
  failing task's code. Its id is ``local:PID``; the tasks are in its process group, so
  ending it outright (``signal_step(step, None)``) kills them all.
- a native MPI launch needs nothing: every rank runs on this host.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from hpcvm.cluster.batch.base import Allocation, TaskPlace
from hpcvm.cluster.batch.spawn import internal_argv
from hpcvm.errors import UsageError
from hpcvm.procs import pid_alive

JOB_PREFIX = "local-"
STEP_PREFIX = "local:"
NODE_PREFIX = "local"
ENV_JOB = "HPCVM_LOCAL_JOB"
ENV_NODE = "HPCVM_LOCAL_NODE"
ENV_INDEX = "HPCVM_LOCAL_INDEX"
ENV_STEP = "HPCVM_LOCAL_STEP"
MAX_NODES = 64
SYSFS_CPU = Path("/sys/devices/system/cpu")


class Local:
    """This host as a cluster of ``--nodes`` nodes (module doc)."""

    name = "local"
    submit_hint = "run it on this machine with --batch local --nodes N"
    nodes_share_this_host = True

    def allocation(self, nodes: int | None, env: Mapping[str, str]) -> Allocation:
        count = 1 if nodes is None else nodes
        if not 1 <= count <= MAX_NODES:
            raise UsageError(f"--nodes {count}: --batch local makes 1 to {MAX_NODES} nodes")
        leader = os.getppid()
        return Allocation(
            batch=self.name,
            job_id=f"{JOB_PREFIX}{leader}",
            nodes=tuple(f"{NODE_PREFIX}{k + 1}" for k in range(count)),
        )

    def task_place(self, env: Mapping[str, str]) -> TaskPlace:
        try:
            return TaskPlace(
                node=env[ENV_NODE], index=int(env[ENV_INDEX]), job_id=env[ENV_JOB],
                step=env[ENV_STEP],
            )  # fmt: skip
        except (KeyError, ValueError) as exc:
            raise UsageError(
                "this command is one task of a step that hpcvm starts itself (cluster up, "
                "bench --nodes), not a command to run by hand"
            ) from exc

    def step_argv(self, allocation: Allocation, name: str, argv: Sequence[str]) -> list[str]:
        return [
            *internal_argv("local-step"),
            allocation.job_id,
            name,
            ",".join(allocation.nodes),
            *argv,
        ]

    def find_step(self, allocation: Allocation, name: str) -> str | None:
        return None  # a step's id reaches the batch node in its tasks' events

    def signal_step(self, step: str, signal_name: str | None) -> bool:
        if not step.startswith(STEP_PREFIX) or not step[len(STEP_PREFIX) :].isdigit():
            return False
        pid = int(step[len(STEP_PREFIX) :])
        try:
            if signal_name is None:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.Signals[f"SIG{signal_name}"])
        except (ProcessLookupError, PermissionError, KeyError):
            return False
        return True

    def native_mpi_env(self, env: Mapping[str, str]) -> list[str]:
        return []

    def this_node(self, env: Mapping[str, str]) -> str:
        return env.get(ENV_NODE) or f"{NODE_PREFIX}1"


# -- the PUs of each node ----------------------------------------------------------------


def core_groups(allowed: Sequence[int], sysfs: Path = SYSFS_CPU) -> list[tuple[int, ...]]:
    """``allowed`` PUs grouped by core (SMT siblings together), cores in order of their
    first PU; a PU whose siblings sysfs does not list is a core of its own."""
    from hpcvm.units import parse_cpu_list

    groups: dict[tuple[int, ...], list[int]] = {}
    for pu in sorted(allowed):
        try:
            text = (sysfs / f"cpu{pu}" / "topology" / "thread_siblings_list").read_text()
            key = tuple(sorted(parse_cpu_list(text.strip())))
        except (OSError, ValueError, UsageError):
            key = (pu,)
        groups.setdefault(key, []).append(pu)
    return sorted((tuple(v) for v in groups.values()), key=lambda g: g[0])


def split_pus(cores: Sequence[tuple[int, ...]], nodes: int) -> list[tuple[int, ...]]:
    """Each node's PUs: the cores dealt in contiguous blocks, as even as they go (the
    first nodes get one more); with fewer cores than nodes, node k gets core k mod C."""
    if not cores:
        return [() for _ in range(nodes)]
    if len(cores) < nodes:
        return [cores[k % len(cores)] for k in range(nodes)]
    base, extra = divmod(len(cores), nodes)
    out: list[tuple[int, ...]] = []
    start = 0
    for k in range(nodes):
        size = base + (1 if k < extra else 0)
        out.append(tuple(pu for core in cores[start : start + size] for pu in core))
        start += size
    return out


# -- a step ------------------------------------------------------------------------------


def leader_of(job_id: str) -> int | None:
    """The job leader's pid from ``local-PID``; None for init or a malformed id."""
    text = job_id.removeprefix(JOB_PREFIX)
    pid = int(text) if text.isdigit() else None
    return pid if pid is not None and pid > 1 else None


class _Step:
    """One running step (module doc): its tasks and what ends them."""

    def __init__(self, job_id: str, nodes: Sequence[str], argv: Sequence[str]) -> None:
        self.job_id = job_id
        self.nodes = tuple(nodes)
        self.argv = list(argv)
        self.tasks: list[subprocess.Popen[bytes]] = []
        self.ending = threading.Event()
        self.lock = threading.Lock()
        self.relays: list[threading.Thread] = []

    def start(self) -> None:
        shares = split_pus(core_groups(sorted(os.sched_getaffinity(0))), len(self.nodes))
        if len(set(shares)) < len(shares):
            sys.stderr.write(
                f"hpcvm: warning: {len(self.nodes)} local nodes on fewer cores: nodes share PUs\n"
            )
        step = f"{STEP_PREFIX}{os.getpid()}"
        for index, node in enumerate(self.nodes):
            env = {
                **os.environ,
                ENV_JOB: self.job_id,
                ENV_NODE: node,
                ENV_INDEX: str(index),
                ENV_STEP: step,
            }
            pus = shares[index]
            task = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                preexec_fn=(lambda pus=pus: os.sched_setaffinity(0, pus)) if pus else None,
            )
            self.tasks.append(task)
            for pipe, out in ((task.stdout, sys.stdout.buffer), (task.stderr, sys.stderr.buffer)):
                assert pipe is not None
                relay = threading.Thread(target=self._relay, args=(pipe, out), daemon=True)
                relay.start()
                self.relays.append(relay)

    def _relay(self, pipe: IO[bytes], out: IO[bytes]) -> None:
        for line in iter(pipe.readline, b""):
            with self.lock:
                out.write(line)
                out.flush()

    def end(self, signum: int = signal.SIGTERM) -> None:
        """Signal every task still running (once per call)."""
        self.ending.set()
        self.relay(signum)

    def relay(self, signum: int) -> None:
        """Pass ``signum`` on to every running task."""
        for task in self.tasks:
            if task.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    task.send_signal(signum)

    def wait(self, leader: int | None) -> int:
        """Until every task has exited; the first failing task's exit code, or 0."""
        watch = _pidfd(leader)
        code = 0
        try:
            while any(t.poll() is None for t in self.tasks):
                if watch is not None and select.select([watch], [], [], 0.2)[0]:
                    os.close(watch)
                    watch = None
                    self.end()  # the job is over: its leader exited
                elif watch is None:
                    self.ending.wait(0.2)
                failed = [t.returncode for t in self.tasks if t.poll() not in (None, 0)]
                if failed and code == 0:
                    code = failed[0] if failed[0] > 0 else 128 - failed[0]
                    self.end()  # --kill-on-bad-exit
        finally:
            if watch is not None:
                os.close(watch)
        for relay in self.relays:
            relay.join(timeout=5)
        return code


def _pidfd(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None


def run_step(job_id: str, step_name: str, nodes: str, argv: Sequence[str]) -> int:
    """The step process (module doc): ``python -m hpcvm.cluster.internal local-step JOB
    NAME NODE,NODE... ARGV...``."""
    del step_name  # named for a person reading ps; the id is the pid
    with contextlib.suppress(PermissionError):
        os.setpgid(0, 0)  # the tasks join this group: signal_step(None) kills them all
    step = _Step(job_id, [n for n in nodes.split(",") if n], argv)
    leader = leader_of(job_id)
    if leader is not None and not pid_alive(leader):
        return 1  # the job ended before its step started
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda _n, _f: step.end())
    # SIGUSR1 is a message to the tasks (a restored job's VMs may run: cluster/tasks/node.py),
    # passed on without ending the step, as Slurm's scancel --signal does
    signal.signal(signal.SIGUSR1, lambda _n, _f: step.relay(signal.SIGUSR1))
    step.start()
    return step.wait(leader)
