"""Kinds of environment a sample runs in (native, container, vm, a plugin's), in one
registry, so that a new kind is one module and one ``register_env_kind`` line, as batch
systems and suite kinds are.

A kind owns:

- which environment names are its (``parse``; the name alone by default) and which
  ``--help`` lists (``names``);
- how one of its environments is made on this host (``one_node``, from an
  ``EnvRequest``: everything any kind may need of the run), and, where it runs across
  the nodes of ``bench --nodes``, how it is made there (``register_across_nodes``: the
  factories live with the cluster code, cluster/benchnodes/environments.py, which this
  stage must not import);
- how tables and figures show it: its place in their order (``rank``) and its fixed
  colour (``colour``; none: the next free one).

Light on purpose: ``hpcvm bench --help`` lists the names (no pydantic); every factory
imports its environment when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcvm.bench.envs.variants import CONTAINER as CONTAINER  # re-exported: kinds' names
from hpcvm.bench.envs.variants import NATIVE as NATIVE
from hpcvm.bench.envs.variants import EnvChoice as EnvChoice
from hpcvm.bench.envs.variants import parse_vm, syntax, vm_names
from hpcvm.errors import UsageError
from hpcvm.registry import Registry

if TYPE_CHECKING:
    from hpcvm.bench.envs.environments import Environment
    from hpcvm.bench.envs.placement import Confinement
    from hpcvm.host.model import HostTopology
    from hpcvm.plan.model import VMPlan

VM = "vm"


@dataclass(frozen=True)
class EnvRequest:
    """What a kind may need to make one environment of a run (module doc): native's
    PUs and memory nodes and how they are held (a container is held alike), the host
    directories a guest must see, the results directory, the run's container runtime
    and VM backend, and for a VM its plan and the name its record takes."""

    choice: EnvChoice
    host: HostTopology
    cpus: tuple[int, ...] | None
    mems: tuple[int, ...]
    confine: Confinement
    shares: tuple[str, ...]
    out_dir: Path
    container_runtime: str
    backend: str
    plan: VMPlan | None = None
    vm_name: str = ""

    @property
    def name(self) -> str:
        return self.choice.name

    @property
    def vm_plan(self) -> VMPlan:
        """The plan a VM environment is made from (session.prepare plans every one)."""
        if self.plan is None:
            raise ValueError(f"{self.name}: a VM environment is made from its plan")
        return self.plan


OneNode = Callable[[EnvRequest], "Environment"]
# (the request, the nodes of a bench --nodes run: cluster/benchnodes/environments.py)
AcrossNodes = Callable[[EnvRequest, Any], "Environment"]


@dataclass(frozen=True)
class EnvKind:
    """One kind of environment (module doc)."""

    name: str
    one_node: OneNode
    parse: Callable[[str], EnvChoice | None] | None = None  # None: its name alone
    names: Callable[[], tuple[str, ...]] | None = None  # None: its name alone
    rank: int = 3  # tables and figures: native 0, container 1, VMs 2, the rest 3
    colour: str | None = None

    def read(self, name: str) -> EnvChoice | None:
        if self.parse is not None:
            return self.parse(name)
        return EnvChoice(kind=self.name) if name == self.name else None

    def listed(self) -> tuple[str, ...]:
        return self.names() if self.names is not None else (self.name,)


ENV_KINDS: Registry[EnvKind] = Registry("environment kind")
ACROSS_NODES: Registry[AcrossNodes] = Registry("environment kind across nodes")


def register_env_kind(kind: EnvKind) -> None:
    """Add a kind (hpcvm's own below, or a plugin's: see hpcvm/plugins.py)."""
    ENV_KINDS.register(kind.name, kind)


def register_across_nodes(kind: str, factory: AcrossNodes) -> None:
    """How environments of ``kind`` are made across the nodes of ``bench --nodes``."""
    ACROSS_NODES.register(kind, factory)


def env_kind(name: str) -> EnvKind | None:
    """The kind a stored environment's kind names (None: one no longer registered)."""
    return ENV_KINDS.get(name)


def valid_env_names() -> tuple[str, ...]:
    return tuple(n for kind in ENV_KINDS.values() for n in kind.listed())


def parse_env(name: str) -> EnvChoice:
    """The environment ``name`` names; UsageError (one line, with the fix) otherwise."""
    for kind in ENV_KINDS.values():
        choice = kind.read(name)
        if choice is not None:
            return choice
    raise UsageError(
        f"unknown environment {name!r}: choose from {', '.join(valid_env_names())} ({syntax()})"
    )


def canonical_env_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """Each name in its canonical spelling; UsageError for a malformed one or for one
    environment named twice (two spellings of one variant included)."""
    out: dict[str, str] = {}
    for typed in names:
        canonical = parse_env(typed).name
        if canonical in out:
            same = f" ({out[canonical]!r} and {typed!r} are one environment)"
            said = same if out[canonical] != typed else ""
            raise UsageError(f"environment {canonical} is listed twice{said}: give each --env once")
        out[canonical] = typed
    return tuple(out)


def make_environment(request: EnvRequest, nodes: object | None = None) -> Environment:
    """The environment ``request`` asks for: on this host, or across ``nodes`` (those of
    a ``bench --nodes`` run) where its kind runs there."""
    kind = ENV_KINDS[request.choice.kind]
    if nodes is None:
        return kind.one_node(request)
    across = ACROSS_NODES.get(kind.name)
    if across is None:
        raise UsageError(
            f"environment {request.name} is of kind {kind.name}, which does not run across "
            f"nodes: drop it or run without --nodes"
        )
    return across(request, nodes)


def _native(request: EnvRequest) -> Environment:
    from hpcvm.bench.envs.native import NativeEnvironment

    return NativeEnvironment(
        request.host, cpus=request.cpus, mems=request.mems, confine=request.confine
    )


def _container(request: EnvRequest) -> Environment:
    from hpcvm.bench.envs.container import ContainerEnvironment

    return ContainerEnvironment(
        request.host,
        cpus=request.cpus,
        mems=request.mems,
        shares=request.shares,
        out_dir=request.out_dir,
        runtime=request.container_runtime,
    )


def _vm(request: EnvRequest) -> Environment:
    from hpcvm.bench.envs.vm import VmEnvironment

    return VmEnvironment(
        request.vm_plan,
        vm_name=request.vm_name,
        backend=request.backend,
        shares=request.shares,
        name=request.name,
        variant=request.choice.variant,
    )


def _read_vm(name: str) -> EnvChoice | None:
    found = parse_vm(name)
    return None if found is None else EnvChoice(kind=VM, profile=found[0], variant=found[1])


register_env_kind(EnvKind(NATIVE, _native, rank=0, colour="#4d4d4d"))
register_env_kind(EnvKind(CONTAINER, _container, rank=1, colour="#17becf"))
register_env_kind(EnvKind(VM, _vm, parse=_read_vm, names=vm_names, rank=2))
