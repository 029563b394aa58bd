"""Environment kinds in one registry (bench/envs/kinds.py): a kind's names parse to it
and are listed, its factory makes its environments on one node, the cluster's makes
them across nodes, and a kind without one is refused there in one line. A kind added
here lives in a copy of the registry (monkeypatch), so no other test sees it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpcvm.bench.envs import kinds
from hpcvm.bench.envs.kinds import (
    ACROSS_NODES,
    ENV_KINDS,
    EnvChoice,
    EnvKind,
    EnvRequest,
    make_environment,
    parse_env,
    valid_env_names,
)
from hpcvm.errors import UsageError
from hpcvm.registry import Registry


def _request(kind: str, host: Any = None) -> EnvRequest:
    return EnvRequest(
        choice=EnvChoice(kind=kind),
        host=host,
        cpus=(0,),
        mems=(0,),
        confine="affinity",
        shares=(),
        out_dir=Path("/nonexistent"),
        container_runtime="auto",
        backend="qemu",
    )


@pytest.fixture
def registries(monkeypatch: pytest.MonkeyPatch) -> tuple[Registry[Any], Registry[Any]]:
    envs: Registry[Any] = Registry("environment kind")
    for name, kind in ENV_KINDS.items():
        envs.register(name, kind)
    across: Registry[Any] = Registry("environment kind across nodes")
    monkeypatch.setattr(kinds, "ENV_KINDS", envs)
    monkeypatch.setattr(kinds, "ACROSS_NODES", across)
    return envs, across


def test_the_built_in_kinds_read_their_names() -> None:
    assert list(ENV_KINDS) == ["native", "container", "vm"]
    assert parse_env("native") == EnvChoice(kind="native")
    assert parse_env("container") == EnvChoice(kind="container")
    vm = parse_env("vm:hpc+e1000")
    assert (vm.kind, vm.profile, vm.variant.nic) == ("vm", "hpc", "e1000")
    assert valid_env_names()[:3] == ("native", "container", "vm:naive")


def test_a_new_kind_is_parsed_listed_and_made(registries: tuple[Registry[Any], Any]) -> None:
    made: list[EnvRequest] = []

    def one_node(request: EnvRequest) -> Any:
        made.append(request)
        return "an environment"

    kinds.register_env_kind(EnvKind("sandbox", one_node))
    assert parse_env("sandbox") == EnvChoice(kind="sandbox")
    assert "sandbox" in valid_env_names()
    assert make_environment(_request("sandbox")) == "an environment"
    assert [r.name for r in made] == ["sandbox"]
    with pytest.raises(UsageError, match="sandbox, which does not run across nodes"):
        make_environment(_request("sandbox"), nodes=object())
    kinds.register_across_nodes("sandbox", lambda request, nodes: ("across", nodes))
    assert make_environment(_request("sandbox"), nodes="the nodes") == ("across", "the nodes")


def test_an_unknown_name_lists_the_registered_kinds(registries: Any) -> None:
    kinds.register_env_kind(EnvKind("sandbox", lambda request: None))
    with pytest.raises(UsageError, match=r"choose from native, container, vm:naive.*sandbox"):
        parse_env("sandbx")


def test_every_built_in_kind_runs_across_nodes() -> None:
    import hpcvm.cluster.benchnodes.environments  # noqa: F401  (registers the factories)

    assert set(ACROSS_NODES) == set(ENV_KINDS)
