"""The software versions recorded with every environment: what ran, so two runs can be
told apart (hpcvm, the kernel, the Debian packages of the suites, QEMU and libvirt)."""

from __future__ import annotations

import functools
import platform
import re
import shutil
import subprocess

from hpcvm import __version__
from hpcvm.bench.suites.registry import suite_packages

_VM_PACKAGES = ("qemu-system-x86", "libvirt-daemon")


@functools.cache
def host_versions() -> dict[str, str]:
    """Software that shapes the numbers: kernel, packages, QEMU, hpcvm."""
    versions = {"hpcvm": __version__, "kernel": platform.release()}
    if shutil.which("dpkg-query"):
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package} ${Version}\n", *suite_packages(), *_VM_PACKAGES],
            capture_output=True,
            text=True,
            check=False,
        )
        for line in proc.stdout.splitlines():
            package, _, version = line.partition(" ")
            if version:
                versions[package] = version
    qemu = shutil.which("qemu-system-x86_64")
    if qemu:
        proc = subprocess.run([qemu, "--version"], capture_output=True, text=True, check=False)
        first = proc.stdout.splitlines()[0] if proc.stdout else ""
        if match := re.search(r"version (\S+)", first):
            versions["qemu"] = match.group(1)
    return versions
