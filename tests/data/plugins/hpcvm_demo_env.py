"""A throw-away environment kind registered from outside hpcvm (tests/unit/test_plugins.py):
one module, one registry call. ``noaslr`` is this host as native is, with the address
space layout randomization of what it runs turned off (``setarch -R``): a difference a
benchmark can see (the ADDR_NO_RANDOMIZE bit of its ``/proc/self/personality``)."""

from collections.abc import Sequence

from hpcvm.bench.envs.kinds import EnvKind, EnvRequest, register_env_kind
from hpcvm.bench.envs.native import NativeEnvironment

NAME = "noaslr"


class NoAslrEnvironment(NativeEnvironment):
    """Native's PUs, memory nodes and confinement; every run under ``setarch -R``."""

    kind = NAME

    def __init__(self, request: EnvRequest) -> None:
        super().__init__(
            request.host, cpus=request.cpus, mems=request.mems, confine=request.confine
        )
        self.name = NAME

    def confined(self, argv: Sequence[str]) -> list[str]:
        return ["/usr/bin/setarch", "-R", *super().confined(argv)]


register_env_kind(EnvKind(NAME, NoAslrEnvironment, colour="#006d2c"))
