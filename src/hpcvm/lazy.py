"""Package attributes imported on first use (PEP 562 ``__getattr__``).

A package's ``__init__`` that imports its submodules makes every import of any one of
them pay for all: ``import hpcvm.plan.model`` (three names for ``--help``) ran the
planner and host discovery, and ``hpcvm.stats`` pulled scipy into every command that
touched a summary. Packages list their public names here instead; each submodule is
imported when a name from it is first read, and type checkers see the names through
the package's ``if TYPE_CHECKING:`` imports.

An exported name may also be a submodule's (``hpcvm.report.compare`` the function and
the module): importing the submodule binds its name on the package, which would hide
the function. An eager ``from .compare import compare`` rebound it; here the package's
class keeps the exported name (Python's documented way to customise a module's
attributes), so both forms read the same.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping


class _LazyPackage(types.ModuleType):
    """A package whose exported names win over the submodules of the same name."""

    _hpcvm_exports: dict[str, str]

    def __setattr__(self, name: str, value: object) -> None:
        exports = self.__dict__.get("_hpcvm_exports", {})
        if (
            name in exports
            and isinstance(value, types.ModuleType)
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            return  # the import system binding the submodule: the export keeps the name
        super().__setattr__(name, value)


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps a module to the names
    the package re-exports from it; an unknown name is an AttributeError. Also makes
    the package a ``_LazyPackage`` (module doc)."""
    where = {name: module for module, names in exports.items() for name in names}
    pkg = sys.modules[package]
    pkg.__class__ = _LazyPackage
    pkg.__dict__["_hpcvm_exports"] = where

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        pkg.__dict__[name] = value  # the next read is a plain attribute
        return value

    return __getattr__
