"""The one place that maps a backend name to its implementation.

Each entry builds a backend from an optional libvirt connection URI. Imports are lazy
so that the QEMU backend works where libvirt-python is not importable. Like every
extension point this is an ``hpcvm.registry.Registry``: a new backend plugs in with one
``register`` call, and an unknown name is a one-line UsageError naming the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hpcvm.registry import Registry

if TYPE_CHECKING:  # the names alone (for --help and option choices) import no model
    from hpcvm.runtime.machine.model import Backend

BackendFactory = Callable[[str | None], "Backend"]


def _qemu(connect_uri: str | None) -> Backend:
    from hpcvm.runtime.backends.qemu_backend import QemuBackend

    return QemuBackend(connect_uri)


def _libvirt(connect_uri: str | None) -> Backend:
    from hpcvm.runtime.backends.libvirt_backend import LibvirtBackend  # type: ignore[import-not-found,unused-ignore]

    backend: Backend = LibvirtBackend(connect_uri)
    return backend


BACKENDS: Registry[BackendFactory] = Registry("backend")
# Backends whose VM is the QEMU process hpcvm started itself, named in its record: /proc
# says whether it runs and its QMP socket stops it, so the commands that must stay light
# (exec, ps, down: runtime/vm/guest_exec.py, inventory.py, stopping.py) need neither the
# backend nor the models for it. Any other (libvirt's daemon owns its QEMU, a plugin's)
# is asked through its backend object, on the full record.
_OWN_PROCESS: set[str] = set()


def register_backend(name: str, factory: BackendFactory, *, own_process: bool = False) -> None:
    """Add a backend (hpcvm's own below, or a plugin's: see hpcvm/plugins.py)."""
    BACKENDS.register(name, factory)
    if own_process:
        _OWN_PROCESS.add(name)


def own_process(name: str) -> bool:
    """Whether backend ``name``'s VM is the QEMU process hpcvm started (above)."""
    return name in _OWN_PROCESS


register_backend("qemu", _qemu, own_process=True)
register_backend("libvirt", _libvirt)


def get_backend(name: str, connect_uri: str | None = None) -> Backend:
    """The backend called ``name``; UsageError naming the known ones otherwise."""
    return BACKENDS.get_or_refuse(name)(connect_uri)
