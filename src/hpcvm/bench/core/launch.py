"""How benchmark processes are started: one argv for the host and for the guest.

Every decision here was checked natively on Debian 12 (Open MPI 4.1.4, PMIx 4.2):

- ``--allow-run-as-root``: hpcvm runs as root (VMs need it) and the guest agent runs
  commands as root; Open MPI refuses root without it.
- ``--mca plm isolated``: single-node launcher. The default rsh launcher looks for
  ``ssh`` in PATH even when every rank is local, and fails under the guest agent's empty
  environment (``env -i mpirun ...`` fails with "plm_rsh_agent: ssh : rsh"; with
  ``plm isolated`` it runs).
- ``--mca pml ob1 --mca btl self,vader``: one node means shared memory (vader) and self
  only; no probing of UCX/OFI/openib/TCP devices a guest does not have, and the same
  transport natively and in the guest.
- ``--map-by core --bind-to core`` (default): one rank per core, pinned, as HPC runs
  are. In a one-node guest whose N vCPUs are pinned 1:1 to host cores, the guest's
  cores are those vCPUs, so this pins each rank to one vCPU and thereby one host core;
  a naive (flat SMP) guest shows N one-core sockets, which binds the same way.
  ``np`` above the core count is refused by mpirun (no ``--oversubscribe``: an
  oversubscribed run measures the scheduler, not the machine). ``hwthread`` counts and
  binds hardware threads instead; ``none`` leaves placement to the kernel.
- ``--report-bindings``: each rank's binding goes to stderr, kept in the run's log as
  evidence of where it ran.

Open MPI also needs at least one network interface up, even on one node: with no
interface at all (``unshare -n`` with ``lo`` down) PMIx's listener fails to start and
mpirun exits 1. A guest must bring ``lo`` up; with only ``lo`` up it works.

Across nodes (``bench --nodes``, set with :func:`across`), the same line differs in
three places only, identically for native and VM runs: no ``plm isolated`` (natively
Open MPI finds the Slurm allocation and starts its daemons with srun; in the first VM
the cluster's environment names the hostfile and the ssh agent), TCP joins the vader
and self transports, told which network to use (``btl_tcp_if_include`` and
``oob_tcp_if_include``: the nodes' and VMs' own, never a management or loopback one),
and ``--map-by node`` deals ranks round-robin over the nodes, so ``-np 2`` on two nodes
puts one rank on each and messages really cross the network.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.units import format_cpu_list

Bind = Literal["core", "hwthread", "none"]

ENV = "/usr/bin/env"
# every run, native or in a guest, starts from the same bare environment (the guest
# agent hands its commands one): environments.py's module docstring says why
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CLEAN_ENV = (ENV, "-i", f"PATH={STD_PATH}")


def decode_output(data: bytes) -> str:
    """A program's output as text, whatever bytes it printed."""
    return data.decode(errors="replace")


_BIND_OPTIONS: dict[str, tuple[str, ...]] = {
    "core": ("--map-by", "core", "--bind-to", "core"),
    "hwthread": ("--use-hwthread-cpus", "--map-by", "hwthread", "--bind-to", "hwthread"),
    "none": ("--map-by", "core", "--bind-to", "none"),
}

MPI_PACKAGE = "openmpi-bin"  # the launcher this module starts


@dataclass(frozen=True)
class Spread:
    """Ranks spread over ``nodes`` nodes joined by ``network`` (an IPv4 CIDR)."""

    nodes: int
    network: str


_SPREAD: ContextVar[Spread | None] = ContextVar("hpcvm_mpi_spread", default=None)


@contextlib.contextmanager
def across(spread: Spread | None) -> Iterator[None]:
    """Inside the block, :func:`mpirun_argv` starts ranks over ``spread``'s nodes
    (None: on this node, as outside)."""
    token = _SPREAD.set(spread)
    try:
        yield
    finally:
        _SPREAD.reset(token)


def current_spread() -> Spread | None:
    """The nodes runs are spread over now; None for one node."""
    return _SPREAD.get()


def find_program(name: str, package: str | None = None) -> str:
    """Absolute path of ``name`` on PATH (the guest shares the host's root, so the same
    path is valid there); BenchmarkError naming ``package`` (the Debian package the
    caller knows provides it) otherwise."""
    found = shutil.which(name)
    if found is None:
        fix = f"install the Debian package {package}" if package else "install it"
        raise BenchmarkError(f"{name} not found on PATH: {fix} (scripts/setup.sh does)")
    return str(Path(found).absolute())


def data_binary(name: str, env: str, what: str, fix: str) -> Path:
    """Where one of hpcvm's own C helpers is: ``$env`` when set, else the package's data
    directory, where ``make all`` builds it; BenchmarkError with ``fix`` (how to build it)
    when it is not there or not executable."""
    override = os.environ.get(env)
    if override:
        path = Path(override).absolute()
    else:
        path = Path(str(resources.files("hpcvm").joinpath("data", name))).absolute()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BenchmarkError(
            f"{what} binary not found at {path}: {fix}{' or fix ' + env if override else ''}"
        )
    return path


def mpirun_program() -> str:
    """The distribution's Open MPI launcher, by its own name so that an installed MPICH
    owning the ``mpirun`` alternative cannot slip in."""
    if shutil.which("mpirun.openmpi"):
        return find_program("mpirun.openmpi", MPI_PACKAGE)
    return find_program("mpirun", MPI_PACKAGE)


def mpirun_argv(
    np: int, argv: Sequence[str], *, bind: Bind = "core", oversubscribe: bool = False
) -> list[str]:
    """``argv`` started as ``np`` MPI ranks on this node (see the module docstring).

    ``oversubscribe`` (with ``bind="none"``) lets ``np`` exceed this node's cores: only
    for runs whose answer matters and whose time does not (an application's native
    reference run, bench/suites/reference.py), never for a sample."""
    if np < 1:
        raise UsageError(f"process count must be at least 1, got {np}")
    if bind not in _BIND_OPTIONS:
        raise UsageError(f"unknown binding {bind!r}: use one of {', '.join(_BIND_OPTIONS)}")
    if not argv:
        raise UsageError("mpirun needs a program to run")
    spread = current_spread()
    if spread is None:
        where = ["--mca", "plm", "isolated", "--mca", "pml", "ob1", "--mca", "btl", "self,vader"]
        placement = list(_BIND_OPTIONS[bind])
    else:
        where = [
            *("--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp"),
            *("--mca", "btl_tcp_if_include", spread.network),
            *("--mca", "oob_tcp_if_include", spread.network),
        ]
        placement = list(_BIND_OPTIONS[bind])
        placement[placement.index("--map-by") + 1] = "node"
    if oversubscribe:
        if bind != "none":
            raise UsageError("an oversubscribed run cannot bind ranks: use bind none")
        placement.append("--oversubscribe")
    return [
        mpirun_program(),
        "--allow-run-as-root",
        *where,
        "--report-bindings",
        "-np",
        str(np),
        *placement,
        *argv,
    ]


def with_cpu_set(argv: Sequence[str], program: str, cpus: Sequence[int] | None) -> list[str]:
    """``argv`` with its mpirun's ranks kept to ``cpus`` on every node (``--cpu-list``);
    unchanged without cpus or without an mpirun.

    Open MPI 4.1 maps a cpu list itself (one slot per listed PU and node, filled in
    order) and refuses it beside ``--map-by``, so the ``--map-by`` pair goes: ranks then
    fill each node's listed PUs in turn, which puts one rank on each node whenever the
    ranks are as many as the nodes, as the VMs' ``--map-by node`` does. (With more ranks
    per node, native numbers them in blocks and the VMs round-robin: the same ranks per
    node, other neighbours.)
    """
    out = list(argv)
    if not cpus or program not in out:
        return out
    if "--map-by" in out:
        at = out.index("--map-by")
        del out[at : at + 2]
    at = out.index(program) + 1
    out[at:at] = ["--cpu-list", format_cpu_list(tuple(cpus))]
    return out


# Every option mpirun_argv writes (and with_cpu_set's --cpu-list), with the
# number of words after it: what tells mpirun's options from the program it starts.
MPIRUN_OPTION_WORDS: dict[str, int] = {
    "--allow-run-as-root": 0,
    "--report-bindings": 0,
    "--use-hwthread-cpus": 0,
    "--oversubscribe": 0,
    "--mca": 2,
    "-np": 1,
    "--map-by": 1,
    "--bind-to": 1,
    "--cpu-list": 1,
}


def with_rank_prefix(argv: Sequence[str], prefix: Sequence[str]) -> list[str]:
    """``argv`` with every MPI rank started through ``prefix`` (``mpirun ... PREFIX
    PROGRAM ARGS``): how ranks enter a container (cluster/benchnodes/containers.py). Without
    an mpirun in ``argv``, the whole command is prefixed. BenchmarkError for an mpirun
    option this module never writes (where the program starts would be a guess)."""
    program = mpirun_program()
    out = list(argv)
    if program not in out:
        return [*prefix, *out]
    at = out.index(program) + 1
    while at < len(out) and out[at].startswith("-"):
        if out[at] not in MPIRUN_OPTION_WORDS:
            raise BenchmarkError(
                f"cannot tell where mpirun's options end in {' '.join(out)}: {out[at]} is "
                "not an option hpcvm writes"
            )
        at += 1 + MPIRUN_OPTION_WORDS[out[at]]
    return [*out[:at], *prefix, *out[at:]]


def in_workdir(workdir: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run from ``workdir``. The change of directory is part of the argv
    (coreutils ``env -C``) because qemu-guest-agent's guest-exec cannot set one."""
    if not workdir.is_absolute():
        raise UsageError(f"work directory must be an absolute path, got {workdir}")
    return [ENV, "-C", str(workdir), *argv]
