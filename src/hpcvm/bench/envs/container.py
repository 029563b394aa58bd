"""The container environment: the same benchmark binaries in an OCI container.

The studies put OS-level virtualization (OpenVZ, LXC) beside hypervisors and native; a
user asking "VM or container for my MPI job?" needs both in one run. ``container`` is
one OCI container per run, started once by a real runtime (runtime/oci/runtime.py: crun or
runc) and left running (its only process sleeps in a read), in which every sample runs
with ``exec``, as samples run in a VM's guest:

- what it sees of the host is what a VM sees (runtime/hostside/shares.py, at the same paths, so
  the very binaries of the native run), plus this environment's work directory under
  the results, read-write (runtime/oci/bundle.py);
- it is confined to the native baseline's PUs and memory nodes (bench/envs/placement.py),
  by the OCI config's cgroup resources, so native, container and VMs run on the same
  PUs and nodes; a user's rootless container has no cgroup to ask for, so each sample's
  ``exec`` runs under the same CPU affinity and memory binding as a user's native run
  (bench/envs/native.py), which the runtime passes on to the process it starts;
- each sample runs under the same clean environment as natively and in a guest, with
  coreutils ``timeout`` inside the container (it kills the benchmark's process group,
  as in the guest); a sample that outlives even that has the container killed (its PID
  namespace dies with its first process) and the next sample starts a new one;
- the runtime and its version, the namespaces, the confinement and the mounts are
  recorded with the environment, as a VM's plan and shares are.

Across nodes (``bench --nodes``) cluster/benchnodes/environments.py holds one container per node.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from hpcvm.bench.envs import evidence
from hpcvm.bench.envs.environments import CLEAN_ENV, CONTAINER, RunOutput, decode_output
from hpcvm.bench.envs.native import affinity_prefix, meminfo_total, mpi_held
from hpcvm.bench.envs.versions import host_versions
from hpcvm.bench.results.outdir import slug
from hpcvm.errors import RuntimeFailure
from hpcvm.host.model import HostTopology
from hpcvm.runtime.oci import runtime as oci
from hpcvm.runtime.oci.bundle import (
    HOSTNAME,
    NAMESPACES,
    BundleSpec,
    cpus_text,
    describe_mounts,
)
from hpcvm.store.records import EnvKind, NewEnvironment

TIMEOUT = "/usr/bin/timeout"  # coreutils' (exit 124), as in a guest
KILL_GRACE = 10.0  # seconds between the timeout's TERM and KILL
HOST_MARGIN = 60.0  # host-side slack over the in-container timeout before killing it
WORK = "work"  # the results' work directory (bench/run/sampling.py)


def bundle_spec(
    *,
    cpus: Sequence[int] | None,
    mems: Sequence[int],
    shares: Sequence[str],
    writable: Sequence[str],
    workdir: str | None,
    hostname: str = HOSTNAME,
) -> BundleSpec:
    """What the container is made of (runtime/oci/bundle.py): a VM's share list for the
    working directory ``workdir`` plus ``shares`` (read-only), and ``writable``."""
    from hpcvm.runtime.hostside import shares as sharing

    requests = [sharing.ShareRequest(s, s, origin="bench") for s in shares]
    wanted, links = sharing.builtin_requests(requests, workdir)
    listed = sharing.share_list(wanted, links)
    hidden = frozenset(
        path
        for share in listed.shares
        for rel in share.hide
        if os.path.isdir(path := f"{share.host_path.rstrip('/')}/{rel}")
        and not os.path.islink(path)
    )
    return BundleSpec(
        args=(),
        shares=listed.shares,
        links=listed.links,
        hidden_dirs=hidden,
        writable=tuple(writable),
        cpus=None if cpus is None else tuple(cpus),
        mems=tuple(mems),
        uid=os.geteuid(),
        gid=os.getegid(),
        rootless=os.geteuid() != 0,
        hostname=hostname,
    )


def describe_container(
    name: str,
    container: oci.Container | None,
    spec: BundleSpec,
    *,
    cpu_model: str,
    vcpus: int,
    memory_bytes: int,
) -> NewEnvironment:
    """A container environment as the store records it: its runtime and version, what
    it shares of the host, its namespaces and confinement."""
    versions = dict(host_versions())
    if container is not None:
        versions["container_runtime"] = f"{container.runtime.name} {container.runtime.version()}"
    versions["container_namespaces"] = " ".join(NAMESPACES) + " (network: the host's)"
    how = " by CPU affinity + memory bind" if spec.rootless and spec.cpus is not None else ""
    versions["container_cpus"] = (
        f"{cpus_text(spec.cpus)} (mems {cpus_text(spec.mems or None)}){how}"
    )
    versions["container_shares"] = "; ".join(describe_mounts(spec))
    if spec.rootless:
        versions["container_rootless"] = "yes"
    return NewEnvironment(
        name=name,
        kind="container",
        accel="native",  # the host CPU runs its code, as natively
        cpu_model=cpu_model,
        versions=versions,
        vcpus=vcpus,
        memory_bytes=memory_bytes,
    )


def run_in(
    container: oci.Container,
    argv: Sequence[str],
    workdir: Path,
    timeout: float,
    *,
    held_by: Sequence[str] = (),
) -> RunOutput:
    """One sample: ``argv`` in ``container`` under the clean environment and an
    in-container timeout; killed from outside when even that overstays (module doc).
    ``held_by``: a command the runtime's ``exec`` runs under (the affinity of a rootless
    container, which the runtime inherits and passes on to what it starts)."""
    workdir.mkdir(parents=True, exist_ok=True)
    wrapped = [TIMEOUT, "-k", f"{KILL_GRACE:g}", f"{timeout:g}", *CLEAN_ENV, *argv]
    irq_before = evidence.read_interrupts()
    start = time.monotonic()
    proc = subprocess.Popen(
        [*held_by, *container.exec_argv(wrapped, cwd=str(workdir))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    killed = False
    try:
        out, err = proc.communicate(timeout=timeout + KILL_GRACE + HOST_MARGIN)
    except subprocess.TimeoutExpired:
        killed = True
        container.kill()
        oci.kill_group(proc)
        out, err = proc.communicate()
    except BaseException:
        container.kill()
        oci.kill_group(proc)
        proc.communicate()
        raise
    seconds = time.monotonic() - start
    rates = evidence.interrupt_rates(irq_before, evidence.read_interrupts(), seconds)
    code = 124 if killed else proc.returncode
    return RunOutput(
        exit_code=code,
        stdout=decode_output(out),
        stderr=decode_output(err),
        host_seconds=seconds,
        timed_out=code == 124,
        evidence={
            "interrupts": {"host": rates},
            "interrupts_total": {"host": evidence.total_rate(rates)},
        },
    )


class ContainerEnvironment:
    """This host's benchmark container (module doc)."""

    kind: EnvKind = "container"

    def __init__(
        self,
        host: HostTopology | None,
        *,
        cpus: Sequence[int] | None,
        mems: Sequence[int],
        shares: tuple[str, ...],
        out_dir: Path,
        runtime: str = oci.AUTO,
        name: str = CONTAINER,
    ) -> None:
        """``cpus``/``mems``: native's (None: unconfined); ``shares``: the suites'
        directories a VM would get (session.py); ``runtime``: a name in
        runtime/oci/runtime.py's RUNTIMES, or auto."""
        oci.check_choice(runtime)
        self.name = name
        self.cpus = None if cpus is None else tuple(cpus)
        self.mems = tuple(mems)
        self.shares = shares
        self.work = out_dir / WORK / slug(name)
        self.runtime_name = runtime
        self.vcpus = len(self.cpus) if self.cpus is not None else len(os.sched_getaffinity(0))
        self.memory_bytes = meminfo_total()
        self._cpu_model = host.cpu_model if host is not None else ""
        self.container: oci.Container | None = None
        self.runtime: oci.OciRuntime | None = None
        self.spec = bundle_spec(
            cpus=self.cpus, mems=self.mems, shares=shares, writable=(), workdir=os.getcwd()
        )

    def start(self) -> None:
        if self.container is not None:
            return
        self.work.mkdir(parents=True, exist_ok=True)
        self.spec = bundle_spec(
            cpus=self.cpus,
            mems=self.mems,
            shares=self.shares,
            writable=(str(self.work.resolve()),),
            workdir=os.getcwd(),
        )
        if self.runtime is None:
            self.runtime = oci.choose(self.runtime_name, self.spec)
        self.container = oci.start(self.runtime, oci.container_id(self.name), self.spec)

    def describe(self) -> NewEnvironment:
        return describe_container(
            self.name,
            self.container,
            self.spec,
            cpu_model=self._cpu_model,
            vcpus=self.vcpus,
            memory_bytes=self.memory_bytes,
        )

    def activate(self) -> None:
        return None  # its only process sleeps in a read: nothing to pause

    def deactivate(self) -> None:
        return None

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        if self.container is not None and not self.container.running():
            self.container.stop()  # killed after a sample overstayed: a new one
            self.container = None
        if self.container is None:
            self.start()
        if self.container is None:
            raise RuntimeFailure(f"{self.name}: the container is not running")
        if self.spec.rootless and self.cpus is not None:  # no cgroup: held as native is
            held = affinity_prefix(self.cpus, self.mems)
            return run_in(self.container, mpi_held(argv, self.cpus), workdir, timeout, held_by=held)
        return run_in(self.container, argv, workdir, timeout)

    def close(self) -> None:
        container, self.container = self.container, None
        if container is not None:
            container.stop()
