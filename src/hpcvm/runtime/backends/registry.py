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
BACKENDS.register("qemu", _qemu)
BACKENDS.register("libvirt", _libvirt)


def get_backend(name: str, connect_uri: str | None = None) -> Backend:
    """The backend called ``name``; UsageError naming the known ones otherwise."""
    return BACKENDS.get_or_refuse(name)(connect_uri)
