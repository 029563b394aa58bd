"""What a user chooses for a bench run (environments, suites) and the defaults the
CLI shows, apart from the models and suites that use them: ``hpcvm bench --help``
imports this module and none of those (pydantic models, the suite code, scipy).
"""

from __future__ import annotations

import sys

from hpcvm.errors import UsageError
from hpcvm.plan.names import PROFILE_NAMES, ProfileName
from hpcvm.units import GIB

NATIVE = "native"
VM_PREFIX = "vm:"

DEFAULT_MAX_REPS = 50  # the reference studies' fixed count: auto should need fewer
DEFAULT_MAX_TIME = 30 * 60.0
DEFAULT_TIMEOUT = 3600.0
DEFAULT_VM_MEMORY = GIB

# hpcvm's own suites in bench/suites.py's registry, named here so that --help needs not
# import it; tests/unit/test_cli_help.py holds the two equal.
BUILTIN_SUITES = ("hpcc", "noise", "npb", "netpipe", "cmd", "openfoam", "lammps")
SUITES_MODULE = "hpcvm.bench.suites"


def valid_env_names() -> tuple[str, ...]:
    return (NATIVE, *(f"{VM_PREFIX}{p}" for p in PROFILE_NAMES))


def parse_env_name(name: str) -> ProfileName | None:
    """None for native, the profile for ``vm:<profile>``; UsageError otherwise."""
    if name == NATIVE:
        return None
    profile = name.removeprefix(VM_PREFIX)
    if name.startswith(VM_PREFIX) and profile in PROFILE_NAMES:
        return profile
    raise UsageError(f"unknown environment {name!r}: choose from {', '.join(valid_env_names())}")


def registered_suite_names() -> tuple[str, ...]:
    """Every suite a run may name, for help: the registry's when it is loaded (a plugin
    that adds a suite imports it to register), else the built-in ones."""
    suites = sys.modules.get(SUITES_MODULE)
    return tuple(suites.REGISTRY) if suites is not None else BUILTIN_SUITES
