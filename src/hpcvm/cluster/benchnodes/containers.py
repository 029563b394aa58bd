"""``hpcvm bench --nodes N --env container``: one benchmark container per node.

How the ranks join: the host network, and the host's MPI launcher. A container has no
sshd and no batch client inside, so neither of the VMs' ways (ssh between guests) nor a
launcher inside the first container can start ranks in the others. HPC sites run MPI
containers the other way round, Apptainer/Singularity's "hybrid model": ``mpirun``
runs on the host and each rank enters the container (``mpirun apptainer exec IMAGE
PROGRAM``). Here that is ``mpirun ... RANK-WRAPPER PROGRAM``: the same native ``mpirun``
line as the native environment (benchnodes/environments.py: the batch system's daemons, the same
PUs per node), whose every rank ``exec``s into its node's container (``container-rank``
below) under the in-container timeout. The ranks then talk over the host's own network
(the containers share it): the same NICs, addresses and transports as native, so what
differs from native is the container alone (its namespaces, mounts and cgroup).

The containers are held by a batch step with one task per node (``container-node``
below), as the VMs are: each task plans its node's native placement itself (the PUs and
memory nodes its VM would have: benchnodes/native_places.py), starts its container confined to
them, says so in a JSON line, and keeps it until the step ends. A task that dies, even
by SIGKILL, takes its container with it (runtime/oci/runtime.py's holder pipe).

A rank finds its node's container from the batch system (``this_node``: Slurm's node
name). Where every node is this one host (``--batch local``) Open MPI starts every rank
on it as on one node (native's ranks meet in shared memory there too), so every rank
joins the first node's container: ranks in two containers would not share a
``/dev/shm`` for Open MPI's shared memory. The other nodes' containers are held all the
same, as the batch system's nodes are.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import ValidationError

from hpcvm.bench.core.launch import mpirun_program, with_cpu_set, with_rank_prefix
from hpcvm.bench.envs.container import KILL_GRACE, TIMEOUT, WORK, bundle_spec, describe_container
from hpcvm.bench.envs.environments import CONTAINER, RunOutput
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.results.outdir import slug
from hpcvm.bench.run.config import BenchConfig
from hpcvm.cluster.batch.base import Allocation
from hpcvm.cluster.batch.registry import get_batch
from hpcvm.cluster.batch.spawn import internal_argv
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.model import Frozen
from hpcvm.runtime.oci import runtime as oci
from hpcvm.runtime.oci.bundle import HOSTNAME, cpus_text
from hpcvm.store.records import EnvKind, NewEnvironment

ENV = "/usr/bin/env"
STEP_NAME = "hpcvm-containers"
UP_TIMEOUT = 300.0  # every node plans its placement and starts its container
DOWN_TIMEOUT = 60.0
MPI_VARIABLES = ("OMPI_", "PMIX_", "OPAL_", "ORTE_")  # what a rank needs of its daemon
# PMIx's shared-memory data stores (gds ds12, ds21) live in the daemon's session
# directory under the host's /tmp, which a container does not see (its /tmp is its
# own): a rank attaching them crashes in gds_ds12_lock_pthread.c. The hash store
# hands the same job data over the daemon's socket instead; only MPI_Init's lookups
# take that path, never a measured message.
# PMIx's "native" security has a client state its uid and gid, and the daemon refuses
# any but its own user's. A rootless container maps the user to root in it (runc needs
# its root mapped: runtime/oci/bundle.py), so a rank there says uid 0 and is refused
# before MPI_Init ends (checked on the test cluster: "OPAL ERROR: Unreachable", after
# which mpirun hung). The daemons listen on the node's loopback over TCP, where PMIx has
# no kernel word on the peer (no SO_PEERCRED): the uid was the client's own claim, so
# "none" drops no check the kernel made. Only this job's mpirun and ranks get it.
NO_CLAIM = "PMIX_MCA_psec=none"
RANK_OVERRIDES = ("PMIX_MCA_gds=hash", NO_CLAIM)


class NodeSpec(Frozen):
    """What every node's task is told (one JSON argument)."""

    config: BenchConfig
    label: str  # the environment's, in container ids
    shares: tuple[str, ...]
    work: str  # the environment's work directory (read-write in the container)
    workdir: str  # the job's working directory (shared like a VM's)
    runtime: str


class NodeContainer(Frozen):
    """One node's container, as its task reports it."""

    node: str
    id: str
    runtime: str
    version: str
    program: str
    root: str
    cpus: tuple[int, ...] | None  # the native placement's (None: not confined further)
    mems: tuple[int, ...]
    allowed: tuple[int, ...] = ()  # the PUs its processes may use at all (the job's)
    step: str


# -- on every node: the task that holds its container -----------------------------------


def node_main(spec_json: str) -> int:
    """One task of the step (``python -m hpcvm.cluster.internal container-node JSON``):
    this node's container up, one JSON line, then held until the step ends."""
    from hpcvm.bench.run.session import native_on
    from hpcvm.host import discover

    try:
        spec = NodeSpec.model_validate_json(spec_json)
    except ValidationError:
        raise UsageError(
            "container-node takes the node specification hpcvm bench --nodes gives it"
        ) from None
    batch = get_batch(spec.config.batch)
    place = native_on(spec.config, discover())
    node = batch.this_node(os.environ)
    bundle = bundle_spec(
        cpus=place.cpus,
        mems=place.mems,
        shares=spec.shares,
        writable=(spec.work,),
        workdir=spec.workdir,
        hostname=f"{HOSTNAME}-{node}",
    )
    runtime = oci.choose(spec.runtime, bundle)
    ended = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda _n, _f: ended.set())
    container = oci.start(runtime, oci.container_id(f"{spec.label}-{node}"), bundle)
    try:
        ready = NodeContainer(
            node=node,
            id=container.id,
            runtime=runtime.name,
            version=runtime.version(),
            program=container.program,
            root=str(oci.state_root()),
            cpus=place.cpus,
            mems=place.mems,
            allowed=tuple(sorted(os.sched_getaffinity(0))),
            step=batch.task_place(os.environ).step,
        )
        sys.stdout.write(ready.model_dump_json() + "\n")
        sys.stdout.flush()
        while not ended.wait(1.0):
            if not container.running():
                raise RuntimeFailure(f"{node}: the benchmark container {container.id} ended")
    finally:
        container.stop()
    return 0


def _pus(c: NodeContainer) -> str:
    """The PUs a node's container runs on: its placement's, else all its node allows."""
    if c.cpus is None and c.allowed:
        return f"{cpus_text(c.allowed)} (all the node allows)"
    return cpus_text(c.cpus)


# -- on every node: one rank entering its node's container ------------------------------


class RankSpec(Frozen):
    """What every rank's wrapper is told (one JSON argument)."""

    batch: str
    containers: tuple[NodeContainer, ...]  # in the allocation's node order
    timeout: float


def rank_container(spec: RankSpec, env: dict[str, str]) -> NodeContainer:
    """The container of the node this rank runs on (module doc)."""
    batch = get_batch(spec.batch)
    if batch.nodes_share_this_host:
        return spec.containers[0]  # Open MPI starts every rank on this one host (doc)
    node = batch.this_node(env)
    for c in spec.containers:
        if c.node == node:
            return c
    have = ", ".join(c.node for c in spec.containers)
    raise RuntimeFailure(f"no benchmark container on node {node} (have: {have})")


def rank_argv(spec: RankSpec, env: dict[str, str], cwd: str, argv: Sequence[str]) -> list[str]:
    """The runtime's ``exec`` of ``argv`` in this rank's container, in ``cwd``, with the
    MPI daemon's variables (the rest of the environment is the container's own, clean
    one) and the in-container timeout."""
    c = rank_container(spec, env)
    given = [f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(MPI_VARIABLES)]
    names = {kv.partition("=")[0] for kv in RANK_OVERRIDES}
    kept = [kv for kv in given if kv.partition("=")[0] not in names]
    passed = [a for kv in (*kept, *RANK_OVERRIDES) for a in ("--env", kv)]
    timed = [TIMEOUT, "-k", f"{KILL_GRACE:g}", f"{spec.timeout:g}", *argv]
    return [c.program, "--root", c.root, "exec", "--cwd", cwd, *passed, c.id, *timed]


def rank_main(spec_json: str, argv: Sequence[str]) -> int:
    """``python -m hpcvm.cluster.internal container-rank JSON PROGRAM ARGS``: becomes
    the runtime's exec of the rank in its node's container."""
    try:
        spec = RankSpec.model_validate_json(spec_json)
    except ValidationError:
        raise UsageError(
            "container-rank takes the rank specification hpcvm bench gives it"
        ) from None
    if not argv:
        raise UsageError("container-rank needs the program to run")
    command = rank_argv(spec, dict(os.environ), os.getcwd(), argv)
    os.execv(command[0], command)
    return 127  # not reached


# -- on the batch node: the environment ---------------------------------------------------


class ClusterContainerEnvironment:
    """One container per node of the job, ranks in them by the hybrid model (module
    doc)."""

    kind: EnvKind = "container"

    def __init__(
        self,
        host: HostTopology | None,
        *,
        config: BenchConfig,
        allocation: Allocation,
        shares: tuple[str, ...],
        out_dir: Path,
        runtime: str = oci.AUTO,
        say: Callable[[str], None] = lambda _text: None,
        name: str = CONTAINER,
    ) -> None:
        oci.check_choice(runtime)
        self.name = name
        self.config = config
        self.allocation = allocation
        self.nodes = len(allocation.nodes)
        self.shares = shares
        self.work = out_dir / WORK / slug(name)
        self.runtime_name = runtime
        self.say = say
        self.log = out_dir / "logs" / f"{slug(name)}-step.log"
        self.native = NativeEnvironment(host, cpus=None)  # how a run is started and timed
        self.vcpus = self.native.vcpus * self.nodes  # until start: native's guess, per node
        self.memory_bytes = self.native.memory_bytes
        self._cpu_model = host.cpu_model if host is not None else ""
        self.ready: list[NodeContainer] = []
        self._step: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self._step is not None:
            return
        self.work.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        spec = NodeSpec(
            config=self.config,
            label=slug(self.name),
            shares=self.shares,
            work=str(self.work.resolve()),
            workdir=os.getcwd(),
            runtime=self.runtime_name,
        )
        batch = get_batch(self.allocation.batch)
        argv = batch.step_argv(
            self.allocation, STEP_NAME, [*internal_argv("container-node"), spec.model_dump_json()]
        )
        with self.log.open("wb") as log:
            self._step = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        try:
            self.ready = self._wait_ready()
        except BaseException:
            self.close()
            raise
        used = sum(len(c.allowed if c.cpus is None else c.cpus) for c in self.ready)
        self.vcpus = used or self.vcpus
        self.say(f"{self.name}: {self.placement()}")

    def _wait_ready(self) -> list[NodeContainer]:
        """Every node's JSON line, or RuntimeFailure with the step's last words."""
        assert self._step is not None and self._step.stdout is not None
        found: dict[str, NodeContainer] = {}
        pending = b""
        deadline = time.monotonic() + UP_TIMEOUT
        while len(found) < self.nodes:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeFailure(
                    f"{self.name}: the nodes' containers were not up within {UP_TIMEOUT:.0f} s"
                )
            if not select.select([self._step.stdout], [], [], min(left, 1.0))[0]:
                if self._step.poll() is not None:
                    raise RuntimeFailure(
                        f"{self.name}: the containers' step ended: {self._last_words()}"
                    )
                continue
            chunk = os.read(self._step.stdout.fileno(), 65536)
            if not chunk:
                self._step.wait(timeout=30)
                raise RuntimeFailure(
                    f"{self.name}: the containers' step ended: {self._last_words()}"
                )
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(b"{"):
                    ready = NodeContainer.model_validate_json(line)
                    found[ready.node] = ready
        return [found[n] for n in self.allocation.nodes if n in found] or list(found.values())

    def _last_words(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return lines[-1] if lines else f"no message (log {self.log})"

    def placement(self) -> str:
        return "; ".join(
            f"{c.node}: {c.id} ({c.runtime} {c.version}), PUs {_pus(c)}, mems {cpus_text(c.mems)}"
            for c in self.ready
        )

    def common_cpus(self) -> tuple[int, ...] | None:
        cpus = {c.cpus for c in self.ready}
        return cpus.pop() if len(cpus) == 1 else None

    def describe(self) -> NewEnvironment:
        first = bundle_spec(
            cpus=None, mems=(), shares=self.shares, writable=(str(self.work),), workdir=os.getcwd()
        )
        described = describe_container(
            self.name,
            None,
            first,
            cpu_model=self._cpu_model,
            vcpus=self.vcpus,
            memory_bytes=self.memory_bytes,
        )
        runtimes = sorted({f"{c.runtime} {c.version}" for c in self.ready})
        versions = {
            **described.versions,
            "nodes": str(self.nodes),
            "container_runtime": "; ".join(runtimes),
            "container_cpus": self.placement(),
            "container_ranks": "mpirun on the host, each rank exec'd into its node's "
            "container (the hybrid model); the host's network; PMIx settings unlike "
            f"native's: {', '.join(RANK_OVERRIDES)}",
        }
        return described.model_copy(update={"versions": versions})

    def activate(self) -> None:
        return None

    def deactivate(self) -> None:
        return None

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        if not self.ready:
            raise RuntimeFailure(f"{self.name}: the containers are not up")
        placed = with_cpu_set(argv, mpirun_program(), self.common_cpus())
        rank = RankSpec(batch=self.allocation.batch, containers=tuple(self.ready), timeout=timeout)
        wrapped = with_rank_prefix(
            placed, [*internal_argv("container-rank"), rank.model_dump_json()]
        )
        batch_env = get_batch(self.allocation.batch).native_mpi_env(os.environ)
        argv = [ENV, *batch_env, NO_CLAIM, *wrapped]
        return self.native.run(argv, workdir, timeout, outputs=outputs)

    def close(self) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        batch = get_batch(self.allocation.batch)
        for s in sorted({c.step for c in self.ready}):
            batch.signal_step(s, "TERM")
        with contextlib.suppress(ProcessLookupError):
            step.send_signal(signal.SIGTERM)
        try:
            step.wait(timeout=DOWN_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(step.pid, signal.SIGKILL)
            step.wait(timeout=30)
        if step.stdout is not None:
            step.stdout.close()
        self.ready = []
