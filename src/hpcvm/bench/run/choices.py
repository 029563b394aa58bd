"""What a user chooses for a bench run (environments, suites) and the defaults the
CLI shows, apart from the models and suites that use them: ``hpcvm bench --help``
imports this module and none of those (pydantic models, the suite code, scipy).
"""

from __future__ import annotations

import importlib
import sys

from hpcvm.bench.core.flags import SuiteFlag
from hpcvm.bench.envs.kinds import CONTAINER as CONTAINER  # re-exported: the names live there
from hpcvm.bench.envs.kinds import NATIVE as NATIVE
from hpcvm.bench.envs.kinds import parse_env as parse_env
from hpcvm.bench.envs.kinds import valid_env_names as valid_env_names
from hpcvm.bench.envs.variants import VM_PREFIX as VM_PREFIX
from hpcvm.bench.envs.variants import EnvChoice as EnvChoice
from hpcvm.runtime.oci.runtimes import AUTO, RUNTIMES
from hpcvm.units import GIB

DEFAULT_MAX_REPS = 50  # the reference studies' fixed count: auto should need fewer
DEFAULT_MAX_TIME = 30 * 60.0
DEFAULT_TIMEOUT = 3600.0
DEFAULT_VM_MEMORY = GIB

# hpcvm's own suites in bench/suites/registry.py's registry, named here so that --help needs not
# import it; tests/unit/test_cli_help.py holds the two equal.
BUILTIN_SUITES = ("hpcc", "noise", "npb", "netpipe", "cmd", "openfoam", "lammps", "bsp")
SUITES_MODULE = "hpcvm.bench.suites.registry"
# auto and the registered OCI runtimes (runtime/oci/runtimes.py: no pydantic, for --help)
CONTAINER_RUNTIMES = (AUTO, *RUNTIMES)


def registered_suite_names() -> tuple[str, ...]:
    """Every suite a run may name, for help: the registry's when it is loaded (a plugin
    that adds a suite imports it to register), else the built-in ones."""
    suites = sys.modules.get(SUITES_MODULE)
    return tuple(suites.REGISTRY) if suites is not None else BUILTIN_SUITES


def registered_flags() -> dict[str, tuple[SuiteFlag, ...]]:
    """Every suite kind's options by kind, for the bench command: the registry's when it is
    loaded (a plugin's kind may add some), else those of the built-in kinds, read from
    their light packages (no suite code, no pydantic)."""
    suites = sys.modules.get(SUITES_MODULE)
    if suites is not None:
        flags: dict[str, tuple[SuiteFlag, ...]] = suites.registered_flags()
        return flags
    return {
        name: importlib.import_module(f"hpcvm.bench.suites.{name}").FLAGS for name in BUILTIN_SUITES
    }
