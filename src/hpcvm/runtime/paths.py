"""Where running VMs live on the host: one private directory per VM.

Separate ``hpcvm`` processes (``up``, ``ps``, ``exec``, ``down``) find a VM only through
this directory, so its location is computed in one place. The root is
``$HPCVM_RUNTIME_DIR`` if set (tests use a temporary one), else ``/run/hpcvm`` for root,
else ``$XDG_RUNTIME_DIR/hpcvm``. VM directories are 0700 and sockets 0600: the QMP and agent
sockets give full control of the guest, so no other user may reach them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hpcvm.plan.validate import check_vm_name

ENV_RUNTIME_DIR = "HPCVM_RUNTIME_DIR"

MACHINE_FILE = "machine.json"
LOCK_FILE = "up.lock"
QMP_SOCKET = "qmp.sock"
AGENT_SOCKET = "agent.sock"
DONE_SOCKET = "done.sock"
CONSOLE_LOG = "console.log"
QEMU_LOG = "qemu.log"
PID_FILE = "qemu.pid"
# A failed ``up`` removes the VM but keeps these logs in <root>/.failed/<name>/ (hidden:
# not a VM), for the error that names them; only the newest KEPT_FAILURES VMs' are kept.
FAILED_DIR = ".failed"
KEPT_LOGS = (CONSOLE_LOG, QEMU_LOG)
KEPT_FAILURES = 8


def runtime_root() -> Path:
    """The directory holding one subdirectory per VM (not created here)."""
    explicit = os.environ.get(ENV_RUNTIME_DIR)
    if explicit:
        return Path(explicit).absolute()
    if os.geteuid() == 0:
        return Path("/run/hpcvm")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "hpcvm"
    return Path(tempfile.gettempdir()) / f"hpcvm-{os.geteuid()}"


def ensure_root() -> Path:
    """Create the runtime root if missing and return it. Mode 0711: nobody else may
    list it, but libvirt's QEMU user may pass through it to the one VM directory it is
    let into (libvirt_backend.let_qemu_reach); every VM directory is 0700 otherwise."""
    root = runtime_root()
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    return root


def check_name(name: str) -> str:
    """Refuse names that would not make a safe directory or socket name (the planner's
    rule, so a plan and an ``up`` accept the same names)."""
    return check_vm_name(name)


def run_dir(name: str) -> Path:
    """The directory of VM ``name`` (it may not exist)."""
    return runtime_root() / check_name(name)


def kept_log(name: str, log: str) -> Path:
    """Where a failed ``up`` of VM ``name`` keeps ``log`` (one of KEPT_LOGS) once its
    run directory is gone: the path its error message names."""
    return runtime_root() / FAILED_DIR / check_name(name) / log


def log_now(run: Path, name: str, log: str) -> Path:
    """``log`` of a VM where it is now: in its run directory while that exists, else
    where a failed ``up`` kept it."""
    here = run / log
    return here if here.exists() else kept_log(name, log)


def make_private(path: Path) -> None:
    """chmod 0600 a socket or file QEMU created with its own umask."""
    if path.exists():
        path.chmod(0o600)
