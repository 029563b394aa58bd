"""Package attributes imported on first use (PEP 562 ``__getattr__``).

A package's ``__init__`` that imports its submodules makes every import of any one of
them pay for all: ``import hpcvm.plan.model`` (three names for ``--help``) ran the
planner and host discovery, and ``hpcvm.stats`` pulled scipy into every command that
touched a summary. Packages list their public names here instead; each submodule is
imported when a name from it is first read, and type checkers see the names through
the package's ``if TYPE_CHECKING:`` imports.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps a module to the names
    the package re-exports from it; an unknown name is an AttributeError."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # the next read is a plain attribute
        return value

    return __getattr__
