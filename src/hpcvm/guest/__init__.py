"""guest stage of the hpcvm pipeline (see DESIGN.md): the built-in guest image.

``ensure_guest()`` returns the cached kernel + initramfs (building it when its inputs
changed); the runtime boots it with the host's root shared over virtio-9p.
"""

from typing import TYPE_CHECKING

from hpcvm.lazy import lazy_exports

if TYPE_CHECKING:
    from hpcvm.guest.image import (
        GuestImage,
        build_guest,
        cached_guest,
        default_cache_dir,
        ensure_guest,
    )

__all__ = [
    "GuestImage",
    "build_guest",
    "cached_guest",
    "default_cache_dir",
    "ensure_guest",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "hpcvm.guest.image": (
            "GuestImage",
            "build_guest",
            "cached_guest",
            "default_cache_dir",
            "ensure_guest",
        ),
    },
)
