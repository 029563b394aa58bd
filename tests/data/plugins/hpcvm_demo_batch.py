"""A throw-away batch system registered from outside hpcvm (tests/integration/
test_cluster_plugins.py): one module, one registry call, as a site would add PBS or Flux.

Its "cluster" is this machine: the allocation is the node names in ``DEMO_NODES`` (as
PBS lists its nodes in ``PBS_NODEFILE``), and a step is this module run as a program,
starting the command once per node with ``DEMO_NODE``/``DEMO_INDEX`` set, relaying the
tasks' output, ending the others when one fails and forwarding SIGTERM. It shares no
code with hpcvm's own batch systems: only the interface (hpcvm/cluster/batch/base.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

from hpcvm.cluster.batch.base import Allocation, TaskPlace
from hpcvm.cluster.batch.registry import BATCH_SYSTEMS
from hpcvm.errors import UsageError


class DemoBatch:
    name = "demo"
    submit_hint = "set DEMO_NODES=a,b"
    nodes_share_this_host = False

    def allocation(self, nodes: int | None, env: Mapping[str, str]) -> Allocation:
        names = tuple(n for n in env.get("DEMO_NODES", "").split(",") if n)
        if not names:
            raise UsageError("the demo batch system needs DEMO_NODES=a,b")
        return Allocation(batch=self.name, job_id=f"demo{os.getpid()}", nodes=names)

    def task_place(self, env: Mapping[str, str]) -> TaskPlace:
        try:
            return TaskPlace(
                node=env["DEMO_NODE"], index=int(env["DEMO_INDEX"]), job_id=env["DEMO_JOB"],
                step=f"demo:{env['DEMO_STEP']}",
            )  # fmt: skip
        except KeyError as exc:
            raise UsageError("not a task of a demo step") from exc

    def step_argv(self, allocation: Allocation, name: str, argv: Sequence[str]) -> list[str]:
        nodes = ",".join(allocation.nodes)
        return [sys.executable, "-m", "hpcvm_demo_batch", allocation.job_id, nodes, *argv]

    def find_step(self, allocation: Allocation, name: str) -> str | None:
        return None

    def signal_step(self, step: str, signal_name: str | None) -> bool:
        pid = int(step.removeprefix("demo:"))
        try:
            os.kill(pid, signal.SIGKILL if signal_name is None else signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True

    def native_mpi_env(self, env: Mapping[str, str]) -> list[str]:
        return []

    def this_node(self, env: Mapping[str, str]) -> str:
        return env.get("DEMO_NODE") or env.get("DEMO_NODES", socket.gethostname()).split(",")[0]


BATCH_SYSTEMS.register("demo", DemoBatch())


def _step(job: str, nodes: list[str], argv: list[str]) -> int:
    tasks = []
    lock = threading.Lock()

    def relay(pipe: object) -> None:
        for line in iter(pipe.readline, b""):  # type: ignore[attr-defined]
            with lock:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()

    for index, node in enumerate(nodes):
        env = {**os.environ, "DEMO_NODE": node, "DEMO_INDEX": str(index), "DEMO_JOB": job,
               "DEMO_STEP": str(os.getpid())}  # fmt: skip
        task = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        threading.Thread(target=relay, args=(task.stdout,), daemon=True).start()
        tasks.append(task)

    def end(*_args: object) -> None:
        for t in tasks:
            if t.poll() is None:
                t.terminate()

    signal.signal(signal.SIGTERM, end)
    codes = []
    while any(t.poll() is None for t in tasks):
        if any(t.poll() not in (None, 0) for t in tasks):
            end()
        threading.Event().wait(0.1)
    codes = [t.returncode for t in tasks]
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    job, nodes, *rest = sys.argv[1:]
    sys.exit(_step(job, nodes.split(","), rest))
