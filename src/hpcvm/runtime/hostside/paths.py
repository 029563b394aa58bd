"""Where running VMs live on the host: one private directory per VM.

Separate ``hpcvm`` processes (``up``, ``ps``, ``exec``, ``down``) find a VM only through
this directory, so its location is computed in one place. The root is
``$HPCVM_RUNTIME_DIR`` if set (tests use a temporary one), else ``/run/hpcvm`` for root,
else ``$XDG_RUNTIME_DIR/hpcvm`` where that is a directory of the user's, else
``/tmp/hpcvm-UID``. VM directories are 0700 and
sockets 0600: the QMP and agent sockets give full control of the guest, so no other user
may reach them.

The root is checked whenever it is asked for (``runtime_root``), as ssh-agent and tmux
check theirs: ``lstat`` (a symbolic link is not followed), owned by this user, not
group- or world-writable. Another user could otherwise make ``/tmp/hpcvm-UID`` first
and read or replace every VM's control sockets. A root that fails is refused in one line
naming it and the fix, before anything starts, by every command that uses it (``up``,
``ps``, ``exec``, ``down``, ``verify``, ``checkpoint``, ``cluster``...). So is a VM name
or root so long that a control socket's path would pass the kernel's limit
(``SOCKET_PATH_MAX``): QEMU would only fail once started.

The same check (``dir_problem``, ``check_dir``) guards every other directory hpcvm keeps
something of a user's in: the cluster state directory (its keys and locks), the
hugetlbfs mount and each VM's directory in it, the address claims directory and
checkpoint directories. Every lock file hpcvm makes for a user lies in a directory so
checked (``up.lock`` in the VM's, ``NAME.lock`` in the cluster state directory).
"""

from __future__ import annotations

import os
import pwd
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hpcvm.errors import UsageError
from hpcvm.host.privilege import for_admin
from hpcvm.plan.names import check_vm_name

ENV_RUNTIME_DIR = "HPCVM_RUNTIME_DIR"

MACHINE_FILE = "machine.json"
LOCK_FILE = "up.lock"
QMP_SOCKET = "qmp.sock"
AGENT_SOCKET = "agent.sock"
RELAY_SOCKET = "relay.sock"  # the agent's relay (runtime/channels/agent_relay.py)
DONE_SOCKET = "done.sock"
CONSOLE_LOG = "console.log"
QEMU_LOG = "qemu.log"
PID_FILE = "qemu.pid"
# A failed ``up`` removes the VM but keeps these logs in <root>/.failed/<name>/ (hidden:
# not a VM), for the error that names them; only the newest KEPT_FAILURES VMs' are kept.
FAILED_DIR = ".failed"
KEPT_LOGS = (CONSOLE_LOG, QEMU_LOG)
KEPT_FAILURES = 8
# sun_path of struct sockaddr_un holds 108 bytes with the terminating NUL (unix(7)).
SOCKET_PATH_MAX = 107
SOCKETS = (QMP_SOCKET, AGENT_SOCKET, DONE_SOCKET, RELAY_SOCKET)


def agent_relay(agent_socket: str | Path) -> Path | None:
    """The relay socket beside a VM's agent socket (its own VM directory's), or None for
    an agent socket laid out otherwise."""
    path = Path(agent_socket)
    return path.with_name(RELAY_SOCKET) if path.name == AGENT_SOCKET else None


def runtime_location() -> tuple[Path, str]:
    """Where the runtime root is, unchecked, and what chose it (the environment
    variable, or "default"): for messages and for code that only compares paths with it
    (runtime/hostside/shares.py)."""
    explicit = os.environ.get(ENV_RUNTIME_DIR)
    if explicit:
        return Path(explicit).absolute(), ENV_RUNTIME_DIR
    if os.geteuid() == 0:
        return Path("/run/hpcvm"), "default"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and _is_own_dir(xdg):
        return Path(xdg).absolute() / "hpcvm", "XDG_RUNTIME_DIR"
    return Path(tempfile.gettempdir()) / f"hpcvm-{os.geteuid()}", "default"


def _is_own_dir(path: str) -> bool:
    """Whether ``path`` is a directory of this user's. An XDG_RUNTIME_DIR that is not
    (a batch job on a compute node inherits the login node's /run/user/UID, which
    nobody made there) is not used, as the XDG Base Directory spec says, rather than
    refused: the per-user directory in /tmp takes its place."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def runtime_root() -> Path:
    """The directory holding one subdirectory per VM (not created here), checked:
    UsageError, naming the fix, when it is not this user's own private directory or
    cannot be made (module doc)."""
    root, source = runtime_location()
    _check_root(root, source)
    return root


def _what(root: Path, source: str) -> str:
    """How a message names the root: by the variable that chose it."""
    if source == "default":
        return f"hpcvm's runtime directory {root}"
    return f"hpcvm's runtime directory {root} (from {source})"


def _elsewhere(source: str) -> str:
    """The fix that always works: a runtime directory of one's own."""
    if source == ENV_RUNTIME_DIR:
        return f"set {ENV_RUNTIME_DIR} to a directory of your own, or unset it"
    return f"set {ENV_RUNTIME_DIR} to a directory of your own"


def _check_root(root: Path, source: str) -> None:
    """Refuse a root another user could reach into (module doc); a missing one must be
    makeable."""
    what = _what(root, source)
    try:
        problem = dir_problem(root)
    except FileNotFoundError:
        _check_makeable(root, source)
        return
    except OSError as exc:
        raise UsageError(
            f"{what} cannot be reached ({_reason(exc)}): {_elsewhere(source)}"
        ) from exc
    if problem is None:
        return
    remove = "" if source == ENV_RUNTIME_DIR else for_admin(f"remove it (`rm -r {root}`), or ")
    fix = {
        "owner": "hpcvm keeps your VMs' control sockets only in a directory of your own; "
        f"{remove}{_elsewhere(source)}",
        "kind": f"remove it (`rm {root}`; hpcvm makes the directory) or {_elsewhere(source)}",
        "writable": f"other users could replace your VMs' control sockets; `chmod go-w {root}`",
        "access": f"`chmod u+rwx {root}`",
    }[problem.kind]
    raise UsageError(f"{what} {problem.text}: {fix}")


@dataclass(frozen=True)
class DirProblem:
    """Why a directory is not safe for what hpcvm keeps in it: ``kind`` (what the fix
    depends on: "owner", "kind", "writable", "access") and the words that say it."""

    kind: str
    text: str


Owners = Literal["me", "me or root", "anyone"]


def dir_problem(path: Path, *, owners: Owners = "me", sticky_ok: bool = False) -> DirProblem | None:
    """Why ``path`` is not a directory other users cannot reach into, or None: the one
    check (as ssh-agent and tmux make theirs) of every directory hpcvm keeps per-user
    state, locks, huge page files, claims or checkpoints in. ``lstat``: a symbolic link
    is never followed. Its owner must be in ``owners`` (default: this user only; None:
    anyone); it may be group- or world-writable only with ``sticky_ok`` and the sticky
    bit, which keeps others from renaming or removing what this user made there (as in
    /tmp). ``owners``: who may own it ("me or root": a directory the admin shares; the
    owner of a directory may always rename what is in it). OSError
    (FileNotFoundError for a missing one) when it cannot be looked at."""
    st = os.lstat(path)
    me = os.geteuid()
    allowed = {"me": (me,), "me or root": (me, 0), "anyone": None}[owners]
    if allowed is not None and st.st_uid not in allowed:
        return DirProblem(
            "owner", f"belongs to {_user_name(st.st_uid)}, not to you ({_user_name(me)})"
        )
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        return DirProblem("kind", f"is {kind}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and mode & stat.S_ISVTX):
        sticky = " without the sticky bit" if sticky_ok else ""
        return DirProblem("writable", f"is group- or world-writable{sticky} (mode {mode:04o})")
    if st.st_uid == me and mode & stat.S_IRWXU != stat.S_IRWXU and me != 0:
        return DirProblem(
            "access", f"is not readable, writable and searchable by you (mode {mode:04o})"
        )
    return None


def check_dir(
    path: Path,
    what: str,
    fix: str,
    *,
    owners: Owners = "me",
    sticky_ok: bool = False,
) -> None:
    """``dir_problem`` as a one-line UsageError: "<what> <path> <problem>: <fix>"; a
    path that cannot be looked at is refused the same way."""
    try:
        problem = dir_problem(path, owners=owners, sticky_ok=sticky_ok)
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be reached ({_reason(exc)}): {fix}") from exc
    if problem is not None:
        raise UsageError(f"{what} {path} {problem.text}: {fix}")


def _reason(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


def _check_makeable(root: Path, source: str) -> None:
    """A missing root: its nearest existing ancestor must be a directory this user may
    write and search, so that ``ensure_root`` will not fail after a plan was made."""
    parent = root.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not os.path.isdir(parent):
        problem = f"{parent} is not a directory"
    elif not os.access(parent, os.W_OK | os.X_OK):
        problem = f"{parent} is not writable by you"
    else:
        return
    raise UsageError(f"{_what(root, source)} cannot be made ({problem}): {_elsewhere(source)}")


def _user_name(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"uid {uid}"


def ensure_root() -> Path:
    """Create the runtime root if missing and return it. Mode 0711: nobody else may
    list it, but libvirt's QEMU user may pass through it to the one VM directory it is
    let into (libvirt_backend.let_qemu_reach); every VM directory is 0700 otherwise.
    Checked again once made: another user may have made it between the check and here."""
    root, source = runtime_location()
    _check_root(root, source)
    try:
        root.mkdir(mode=0o711, parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{_what(root, source)} cannot be made ({_reason(exc)}): {_elsewhere(source)}"
        ) from exc
    _check_root(root, source)
    return root


def check_name(name: str) -> str:
    """Refuse names that would not make a safe directory or socket name (the planner's
    rule, so a plan and an ``up`` accept the same names)."""
    return check_vm_name(name)


def run_dir(name: str) -> Path:
    """The directory of VM ``name`` (it may not exist). UsageError when a control
    socket's path in it would be too long for the kernel (``SOCKET_PATH_MAX``): QEMU
    would fail only once started, so ``up`` refuses it before anything starts."""
    directory = runtime_root() / check_name(name)
    check_socket_paths(directory)
    return directory


def check_socket_paths(directory: Path) -> None:
    """Refuse a VM directory whose longest control socket path passes the limit."""
    longest = max((directory / sock for sock in SOCKETS), key=lambda p: len(os.fsencode(p)))
    size = len(os.fsencode(longest))
    if size > SOCKET_PATH_MAX:
        raise UsageError(
            f"the VM's control socket {longest} would be {size} bytes long, over the "
            f"{SOCKET_PATH_MAX}-byte limit of a Unix socket's path: use a shorter VM name "
            f"or set {ENV_RUNTIME_DIR} to a shorter directory (e.g. /tmp/hpcvm-{os.geteuid()})"
        )


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
