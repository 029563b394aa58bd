"""The one place that maps a backend name to its implementation.

Each entry builds a backend from an optional libvirt connection URI. Imports are lazy
so that the QEMU backend works where libvirt-python is not importable, and a new
backend plugs in by adding one line here.
"""

from __future__ import annotations

from collections.abc import Callable

from hpcvm.errors import UsageError
from hpcvm.runtime.model import Backend

BackendFactory = Callable[[str | None], Backend]


def _qemu(connect_uri: str | None) -> Backend:
    from hpcvm.runtime.qemu_backend import QemuBackend

    return QemuBackend(connect_uri)


def _libvirt(connect_uri: str | None) -> Backend:
    from hpcvm.runtime.libvirt_backend import LibvirtBackend  # type: ignore[import-not-found,unused-ignore]

    backend: Backend = LibvirtBackend(connect_uri)
    return backend


BACKENDS: dict[str, BackendFactory] = {
    "qemu": _qemu,
    "libvirt": _libvirt,
}


def get_backend(name: str, connect_uri: str | None = None) -> Backend:
    """The backend called ``name``; UsageError for an unknown one."""
    factory = BACKENDS.get(name)
    if factory is None:
        raise UsageError(f"unknown backend {name!r}: choose one of {', '.join(sorted(BACKENDS))}")
    return factory(connect_uri)
