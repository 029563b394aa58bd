"""Shared helpers for the guest tests: the real distribution kernel, unpacked once.

``unpacked_kernel()`` fetches the kernel package the way hpcvm does (``apt-get
download`` into hpcvm's cache, reusing a .deb already there), unpacks it into a
temporary directory with ``dpkg-deb -x`` and runs ``depmod``: tests read the very
modules.dep, modules and vmlinuz the built-in guest is built from. The unpacked tree
(about 400 MB) is made once per test process and removed when it exits.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from hpcvm.guest import kernel as kernels
from hpcvm.guest.image import default_cache_dir


def package_cache() -> Path:
    """hpcvm's own .deb cache, shared with ``hpcvm guest build``."""
    return default_cache_dir() / "debs"


@functools.cache
def unpacked_kernel() -> kernels.KernelTree:
    """The distribution kernel package, unpacked, with modules.dep."""
    debs = package_cache()
    package = kernels.resolve_package(debs)
    deb = kernels.fetch_package(package, debs)
    scratch = Path(tempfile.mkdtemp(prefix="hpcvm-test-kernel-"))
    atexit.register(shutil.rmtree, scratch, True)
    return kernels.unpack_package(deb, package, scratch / "root")


def modules_dep_lines(tree: kernels.KernelTree) -> dict[str, list[str]]:
    """modules.dep read directly (independently of hpcvm's parser): module file base
    name without .ko -> base names of what its line lists."""
    out: dict[str, list[str]] = {}
    for line in (tree.modules_dir / "modules.dep").read_text().splitlines():
        target, _, deps = line.partition(":")
        name = Path(target).name.split(".ko")[0]
        out[name] = [Path(d).name.split(".ko")[0] for d in deps.split()]
    return out
