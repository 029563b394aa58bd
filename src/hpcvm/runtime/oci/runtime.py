"""OCI containers through a real runtime: crun or runc, as Debian packages them.

Runtimes are a registry (``RUNTIMES``); both speak the command line runc defined
(``run --detach``, ``exec``, ``state``, ``kill``, ``delete``), so one class drives
either. ``auto`` takes the first registered runtime that is installed and runs the
actual bundle here (a probe: the bundle's config with ``/usr/bin/true`` as its process),
so a runtime that refuses this host says why: crun 1.8 refuses a host whose cgroup v2
hierarchy holds a controller beside the v1 ones ("cgroups in hybrid mode not
supported"), where runc runs.

A container lives as long as its holder: its first process is a shell reading its
standard input, which is a pipe this process holds (``Container.holder``). Closing the
pipe, or this process dying however it dies (SIGKILL included), ends that shell; the
container's PID namespace dies with its first process, so every process in it ends too.
``stop`` then deletes it. What a killed bench leaves (a stopped container's state and
bundle) is deleted by the next ``sweep``: container ids carry the pid of the process
that made them.

State and bundles live under hpcvm's runtime root (``.containers``: hidden, so the VM
listing skips it), never in the runtime's system-wide default root.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.oci import bundle as oci_bundle
from hpcvm.runtime.oci.bundle import BundleSpec
from hpcvm.runtime.oci.runtimes import AUTO as AUTO
from hpcvm.runtime.oci.runtimes import RUNTIMES as RUNTIMES
from hpcvm.runtime.oci.runtimes import OciRuntime as OciRuntime

DIR = ".containers"
ID_PREFIX = "hpcvm-"
INIT = ("/bin/sh", "-c", "read -r _")  # ends when the holder's pipe closes (module doc)
START_TIMEOUT = 60.0
STOP_GRACE = 5.0  # seconds for the first process to end on its own before delete --force


def check_choice(name: str) -> None:
    """``auto`` or a registered runtime that is installed; UsageError else (before
    anything starts)."""
    if name == AUTO:
        if not any(r.program() for r in RUNTIMES.values()):
            packages = " or ".join(r.package for r in RUNTIMES.values())
            raise UsageError(
                f"container: no OCI runtime installed: install {packages} (scripts/setup.sh does)"
            )
        return
    runtime = RUNTIMES.get_or_refuse(name)
    if runtime.program() is None:
        raise UsageError(
            f"--container-runtime {name}: {name} is not installed: install the Debian "
            f"package {runtime.package}, or choose {AUTO}"
        )


def containers_dir() -> Path:
    return paths.runtime_root() / DIR


def state_root() -> Path:
    return containers_dir() / "state"


def _bundles() -> Path:
    return containers_dir() / "bundles"


def container_id(label: str) -> str:
    """An id naming this process (so ``sweep`` knows when its maker is gone)."""
    return f"{ID_PREFIX}{os.getpid()}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', label)}"


@dataclass
class Container:
    """A running container (module doc)."""

    runtime: OciRuntime
    program: str
    id: str
    bundle: Path
    holder: IO[bytes] | None = field(default=None, repr=False)

    def argv(self, *args: str) -> list[str]:
        """A command of this container's runtime, on hpcvm's own state root."""
        return [self.program, "--root", str(state_root()), *args]

    def exec_argv(self, argv: list[str], *, cwd: str, env: list[str] | None = None) -> list[str]:
        """The command that runs ``argv`` in the container, in ``cwd``."""
        extra = [a for kv in env or () for a in ("--env", kv)]
        return self.argv("exec", "--cwd", cwd, *extra, self.id, *argv)

    def state(self) -> dict[str, Any]:
        """The runtime's own account of the container (``state``): status, pid..."""
        done = subprocess.run(
            self.argv("state", self.id), capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode != 0:
            return {"status": "gone", "error": done.stderr.strip()}
        state: dict[str, Any] = json.loads(done.stdout)
        return state

    def running(self) -> bool:
        return self.state().get("status") == "running"

    def kill(self) -> None:
        """SIGKILL its first process: its PID namespace, so everything in it, ends."""
        subprocess.run(
            self.argv("kill", self.id, "KILL"), capture_output=True, timeout=30, check=False
        )

    def stop(self) -> None:
        """Close the holder's pipe (the first process exits, and with it everything in
        the container), then delete the container, killing what lingers, and its
        bundle. Safe to call twice."""
        holder, self.holder = self.holder, None
        if holder is not None:
            with contextlib.suppress(OSError):
                holder.close()
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and self.state().get("status") == "running":
            time.sleep(0.05)
        _delete(self.program, self.id)
        shutil.rmtree(self.bundle, ignore_errors=True)


def _delete(program: str, cid: str) -> None:
    subprocess.run(
        [program, "--root", str(state_root()), "delete", "--force", cid],
        capture_output=True,
        timeout=60,
        check=False,
    )


def write_bundle(cid: str, spec: BundleSpec) -> Path:
    """The bundle directory: an empty read-only root holding the host's root symlinks
    (the mounts make the rest) and config.json."""
    bundle = _bundles() / cid
    shutil.rmtree(bundle, ignore_errors=True)
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True, mode=0o755)
    for link in spec.links:
        (rootfs / link.guest_path.lstrip("/")).symlink_to(link.target)
    (bundle / "config.json").write_text(json.dumps(oci_bundle.config(spec), indent=1))
    return bundle


def _error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def probe(runtime: OciRuntime, spec: BundleSpec) -> str | None:
    """Why ``runtime`` cannot run ``spec`` here (its own error line), or None when it
    ran it (with ``/usr/bin/true`` as the process)."""
    program = runtime.program()
    if program is None:
        return f"not installed (Debian package {runtime.package})"
    cid = container_id(f"probe-{runtime.name}")
    bundle = write_bundle(cid, replace(spec, args=("/usr/bin/true",), cgroup=cid))
    try:
        done = subprocess.run(
            [program, "--root", str(state_root()), "run", "--bundle", str(bundle), cid],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"the probe did not end within {START_TIMEOUT:.0f} s"
    finally:
        _delete(program, cid)
        shutil.rmtree(bundle, ignore_errors=True)
    return None if done.returncode == 0 else _error_line(done.stderr + done.stdout)


CGROUP_FS = ("cgroup", "cgroup2")


def cgroup_mounted(mountinfo: str) -> bool:
    """Whether a cgroup file system is mounted under /sys/fs/cgroup (fifth field the
    mount point, the file system type after the `` - `` separator)."""
    for line in mountinfo.splitlines():
        head, _, tail = line.partition(" - ")
        fields = head.split()
        if (
            len(fields) > 4
            and fields[4].startswith("/sys/fs/cgroup")
            and tail.split()[:1] in ([fs] for fs in CGROUP_FS)
        ):
            return True
    return False


def choose(name: str, spec: BundleSpec) -> OciRuntime:
    """The runtime ``name`` names, or for ``auto`` the first that runs ``spec`` here;
    BenchmarkError saying why each could not."""
    if not cgroup_mounted(Path("/proc/self/mountinfo").read_text()):
        raise BenchmarkError(
            "container: no cgroup file system is mounted at /sys/fs/cgroup here, which an "
            "OCI runtime confines its container with (`ip netns exec` mounts a /sys of its "
            "own without it): mount the host's cgroup hierarchies there"
        )
    candidates = list(RUNTIMES.values()) if name == AUTO else [RUNTIMES.get_or_refuse(name)]
    refused = []
    for runtime in candidates:
        why = probe(runtime, spec)
        if why is None:
            return runtime
        refused.append(f"{runtime.name}: {why}")
    raise BenchmarkError(
        f"container: no OCI runtime runs the benchmark container here ({'; '.join(refused)}): "
        "install another (scripts/setup.sh installs crun and runc)"
    )


def start(runtime: OciRuntime, cid: str, spec: BundleSpec) -> Container:
    """Start the container ``cid`` of ``spec`` (its process is ``INIT``), held by a pipe
    of this process (module doc); BenchmarkError with the runtime's message."""
    program = runtime.program()
    if program is None:
        raise BenchmarkError(f"{runtime.name} is not installed: install {runtime.package}")
    sweep()
    state_root().mkdir(parents=True, exist_ok=True, mode=0o700)
    bundle = write_bundle(cid, replace(spec, args=INIT, cgroup=cid))
    log = bundle / "runtime.log"
    read_end, write_end = os.pipe()
    try:
        with log.open("wb") as err:
            done = subprocess.run(
                [
                    program,
                    "--root",
                    str(state_root()),
                    "run",
                    "--detach",
                    "--bundle",
                    str(bundle),
                    cid,
                ],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=err,
                timeout=START_TIMEOUT,
                check=False,
            )
    except BaseException:
        os.close(write_end)
        _delete(program, cid)
        shutil.rmtree(bundle, ignore_errors=True)
        raise
    finally:
        os.close(read_end)
    container = Container(
        runtime=runtime, program=program, id=cid, bundle=bundle, holder=os.fdopen(write_end, "wb")
    )
    if done.returncode != 0:
        why = _error_line(log.read_text(errors="replace"))
        container.stop()
        raise BenchmarkError(f"container: {runtime.name} could not start it: {why}")
    return container


def sweep() -> None:
    """Delete the containers (and bundles) of hpcvm processes that are gone."""
    for bundle in sorted(_bundles().glob(f"{ID_PREFIX}*")) if _bundles().is_dir() else []:
        pid = bundle.name.removeprefix(ID_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for runtime in RUNTIMES.values():
                if (program := runtime.program()) is not None:
                    _delete(program, bundle.name)
            shutil.rmtree(bundle, ignore_errors=True)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a runtime command started in its own session, and what it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
