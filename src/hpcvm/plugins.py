"""Extensions from outside the package: a suite, a render target, a report format, a
VM backend, a network kind, a host tuning setting.

Each extension point is a registry (bench/suites/registry.py REGISTRY, render/targets.py
TARGETS, report/formats.py FORMATS, runtime/backends/registry.py BACKENDS, runtime/net/network.py
NETWORK_KINDS, tune/registry.py REGISTRY); an extension is a module that calls that
registry's ``register`` once when imported. hpcvm imports such modules before it
builds its commands, so their names appear in ``--help`` and in the choices of every
option, exactly like hpcvm's own:

- modules named in ``HPCVM_PLUGINS`` (comma-separated), for a site's own scripts;
- the ``hpcvm.plugins`` entry points of installed packages.

A module that cannot be imported is a one-line UsageError naming it: a typo in
HPCVM_PLUGINS must not leave a user wondering why their suite is missing.

Every ``hpcvm`` command looks for plugins, ``--help`` and ``--version`` included, and
importing ``importlib.metadata`` alone took 0.08-0.10 s on the development machine, half
of ``hpcvm --version``. So the entry points are read through it only when a
distribution's metadata on ``sys.path`` names the group at all (:func:`_group_declared`:
one directory listing per path entry and a read of the few ``entry_points.txt`` files).
"""

from __future__ import annotations

import importlib
import os
import sys

from hpcvm.errors import UsageError

ENV_VAR = "HPCVM_PLUGINS"
ENTRY_POINT_GROUP = "hpcvm.plugins"

_loaded: set[str] = set()


def load_plugins() -> list[str]:
    """Import every configured plugin module once; the names imported by this call."""
    names = [n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip()]
    done: list[str] = []
    for name in names:
        if name in _loaded:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # any failure of a user's module is theirs to see
            raise UsageError(
                f"{ENV_VAR}: cannot import plugin module {name!r}: "
                f"{type(exc).__name__}: {exc}; fix the module or remove it from {ENV_VAR}"
            ) from exc
        _loaded.add(name)
        done.append(name)
    if not _group_declared():
        return done
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.value in _loaded:
            continue
        try:
            point.load()
        except Exception as exc:
            raise UsageError(
                f"plugin {point.name!r} ({point.value}) of an installed package cannot be "
                f"loaded: {type(exc).__name__}: {exc}"
            ) from exc
        _loaded.add(point.value)
        done.append(point.value)
    return done


def _group_declared(paths: list[str] | None = None) -> bool:
    """Whether any distribution's ``entry_points.txt`` on ``paths`` (``sys.path``)
    mentions the plugin group; True, to be safe, for a path entry that is a file (a
    zip or an egg, whose metadata only importlib.metadata reads)."""
    for entry in sys.path if paths is None else paths:
        try:
            listing = os.scandir(entry or ".")
        except NotADirectoryError:
            return True
        except OSError:
            continue  # a path entry that does not exist, as sys.path may hold
        with listing:
            for item in listing:
                if item.name.endswith((".dist-info", ".egg-info")) and _mentions(item.path):
                    return True
    return False


def _mentions(metadata_dir: str) -> bool:
    try:
        with open(os.path.join(metadata_dir, "entry_points.txt"), encoding="utf-8") as f:
            return ENTRY_POINT_GROUP in f.read()
    except (OSError, UnicodeDecodeError):
        return False
