"""The OCI runtimes hpcvm can drive (``RUNTIMES``: crun and runc, as Debian packages
them; a plugin may register another that speaks runc's command line) and ``auto``,
apart from the bundles' models, so that ``hpcvm bench --help`` lists the choices from
the registry itself without importing pydantic (runtime/oci/runtime.py drives them)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from hpcvm.registry import Registry

AUTO = "auto"  # the first registered runtime that is installed and runs the bundle here


@dataclass(frozen=True)
class OciRuntime:
    """One OCI runtime: its program's name and the Debian package that installs it."""

    name: str
    package: str

    def program(self) -> str | None:
        return shutil.which(self.name)

    def version(self) -> str:
        """``1.8.1``: the first line of ``NAME --version``'s version word."""
        program = self.program()
        if program is None:
            return ""
        done = subprocess.run(
            [program, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        match = re.search(r"version (\S+)", done.stdout)
        return match.group(1) if match else ""


RUNTIMES: Registry[OciRuntime] = Registry("OCI runtime")
RUNTIMES.register("crun", OciRuntime(name="crun", package="crun"))
RUNTIMES.register("runc", OciRuntime(name="runc", package="runc"))
