"""What of the host a guest sees: a list of shared directories, never the whole host.

The built-in guest gets, read-only: the system directories programs need to run as
they do natively (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/opt``; on a merged-/usr
host the ``/bin``-style ones are the same symlinks as on the host), ``/etc`` with its
secrets hidden, hpcvm's own helper programs, the working directory of the command when
it is a job's directory (``workdir_refusal``), and every
``--share HOST_DIR[:GUEST_DIR][:rw]``. All at the same paths as on the host, so
the guest runs the very binaries and libraries of a native run. Read-only shares get a
tmpfs overlay in the guest (writes stay in the guest); ``:rw`` shares write through to
the host. ``/root``, ``/home``, ``/var``, ``/run``, ``/srv`` and the host's ``/proc``
are not there. A disk image (``--image``) gets only the ``--share`` directories. The
QEMU backend serves the read-only ones as one 9p export where it can
(runtime/hostside/staging.py): the same list, one device for the guest to mount.

Two layers keep secrets out. QEMU runs unprivileged (runtime/hostside/confine.py), so whatever
is shared, a file only root may read stays unreadable. And ``/etc``'s secrets (shadow
files, sudoers, SSH host keys, and anything there not readable by every user) are
whited out in the guest's overlay, so the guest does not even see their names.

Every ``--share`` is checked before anything starts; each bad one is a one-line usage
error naming the fix.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import hpcvm
from hpcvm.bootspec import GuestLink, Share
from hpcvm.errors import UsageError
from hpcvm.host.privilege import for_admin
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.hostside.confine import QemuUser, can_access, describe_mode

# Candidates for the read-only system shares, in this order; those the host lacks are
# skipped, symlinks are recreated in the guest as symlinks.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/etc")
ETC = "/etc"
# Hidden in /etc whatever their mode (relative glob patterns), besides every entry that
# not every user may read.
ETC_SECRETS = (
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "security/opasswd",
    "ssh/ssh_host_*_key",
    "ssl/private",
)
_SECRETS_RE = re.compile("|".join(fnmatch.translate(p) for p in ETC_SECRETS))
GUEST_RESERVED = ("/", "/proc", "/sys", "/dev", "/run")  # the guest's own, never a share
TAG_PREFIX = "hpcvm"
SHARES_SUMMARY = (
    "read-only /usr, /bin, /sbin, /lib*, /opt and /etc without secrets, hpcvm's helpers "
    "and the working directory; plus each --share (added by `hpcvm up`)"
)

Warn = Callable[[str], None]


@dataclass(frozen=True)
class ShareRequest:
    """A directory to share: where it is on the host, where the guest sees it."""

    host_path: str  # absolute, symlinks resolved
    guest_path: str  # absolute, normalised
    writable: bool = False
    origin: str = "--share"  # system, working directory, hpcvm helpers, --share


@dataclass(frozen=True)
class ShareList:
    """What the guest mounts: 9p shares and symlinks for its root."""

    shares: tuple[Share, ...]
    links: tuple[GuestLink, ...]
    origins: tuple[str, ...]  # per share, for ``describe``


# -- --share ---------------------------------------------------------------------------


def parse_share(spec: str) -> ShareRequest:
    """``HOST_DIR[:GUEST_DIR][:rw]`` (``:ro`` is the default and may be written).

    UsageError for a relative or missing path, a path that is or contains ``/`` or the
    runtime directory, a guest path the guest keeps for itself, or ``:rw`` on a
    read-only file system.
    """
    text = spec
    writable = False
    for suffix, flag in ((":rw", True), (":ro", False)):
        if text.endswith(suffix):
            text, writable = text[: -len(suffix)], flag
            break
    if "\n" in text or "\0" in text:
        raise UsageError(f"--share {spec!r}: a path with a newline cannot be shared")
    parts = text.split(":")
    if len(parts) > 2 or not parts[0]:
        raise UsageError(
            f"--share {spec!r}: write HOST_DIR[:GUEST_DIR][:rw] (a path with ':' cannot be shared)"
        )
    host, guest = parts[0], parts[1] if len(parts) == 2 else parts[0]
    for what, path in (("host", host), ("guest", guest)):
        if not path.startswith("/"):
            raise UsageError(f"--share {spec!r}: the {what} path must be absolute, not {path!r}")
    real = os.path.realpath(host)
    _check_dir(spec, host, real)
    _refuse_host_path(spec, real)
    guest_path = os.path.normpath(guest)
    if any(_within(guest_path, reserved) for reserved in GUEST_RESERVED if reserved != "/"):
        raise UsageError(f"--share {spec!r}: {guest_path} is the guest's own; pick another")
    if guest_path == "/":
        raise UsageError(f"--share {spec!r}: the guest path cannot be /; pick a directory")
    if writable and os.statvfs(real).f_flag & os.ST_RDONLY:
        raise UsageError(
            f"--share {spec!r}: {host} is on a read-only file system; drop ':rw' or "
            "share a writable directory"
        )
    return ShareRequest(real, guest_path, writable)


def _check_dir(spec: str, host: str, real: str) -> None:
    """A share's host path must be a directory this user can reach."""
    try:
        is_dir = stat.S_ISDIR(os.stat(real).st_mode)
    except FileNotFoundError:
        raise UsageError(f"--share {spec!r}: {host} does not exist") from None
    except OSError as exc:
        raise UsageError(
            f"--share {spec!r}: {host} cannot be reached ({os.strerror(exc.errno or 0)}): "
            "share a directory you may read"
        ) from None
    if not is_dir:
        raise UsageError(f"--share {spec!r}: {host} is not a directory; share its directory")


def _refuse_host_path(spec: str, real: str) -> None:
    why = share_refusal(real)
    if why is not None:
        raise UsageError(f"--share {spec!r}: {why}; share the directories the guest needs")


def share_refusal(real: str) -> str | None:
    """Why ``--share real`` (absolute, symlinks resolved) is refused whatever else is
    asked, or None: one rule, so that a message suggesting ``--share`` (the working
    directory's warning, ``check_job_dir``) suggests only what is accepted."""
    if real == "/":
        return "that is the host's whole root"
    runtime = _runtime_dir()
    if _within(runtime, real):
        return f"it contains hpcvm's runtime directory {runtime} (the VMs' control sockets)"
    return None


def _runtime_dir() -> str:
    """hpcvm's runtime directory, symlinks resolved: only compared with here (whether
    it is usable is for the commands that use it to say)."""
    return os.path.realpath(paths.runtime_location()[0])


def share_hint(real: str) -> str:
    """The fix for a directory the guests do not see on their own, naming ``--share``
    only as it would be accepted: as it is, or with the runtime directory moved out of
    it first, or not at all (the whole root)."""
    own = f"run from a directory of the job's own (e.g. {real.rstrip('/')}/job)"
    if real == "/":
        return own
    if share_refusal(real) is None:
        return f"{own}, or share it with --share {real}"
    return f"{own}, or set {paths.ENV_RUNTIME_DIR} to a directory outside it and --share {real}"


def parse_shares(specs: Iterable[str]) -> tuple[ShareRequest, ...]:
    """Every ``--share``, checked; two shares at one guest path are an error."""
    requests = tuple(parse_share(spec) for spec in specs)
    seen: dict[str, str] = {}
    for request in requests:
        if request.guest_path in seen:
            raise UsageError(
                f"--share: {seen[request.guest_path]} and {request.host_path} are both "
                f"shared at {request.guest_path}; give each its own guest path"
            )
        seen[request.guest_path] = request.host_path
    return requests


def _within(path: str, parent: str) -> bool:
    """``path`` is ``parent`` or lies under it (both absolute and normalised)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


# -- the built-in guest's list ---------------------------------------------------------


def helpers_dir() -> Path:
    """hpcvm's own programs the guest runs (the noise benchmark), wherever it is
    installed."""
    return Path(hpcvm.__file__).resolve().parent / "data"


def builtin_requests(
    user: Sequence[ShareRequest], workdir: str | None, warn: Warn | None = None
) -> tuple[list[ShareRequest], list[GuestLink]]:
    """The built-in guest's shares (module doc) and root symlinks, in that order."""
    requests: list[ShareRequest] = []
    links: list[GuestLink] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            links.append(GuestLink(guest_path=path, target=os.readlink(path)))
        elif os.path.isdir(path):
            requests.append(ShareRequest(path, path, origin="system"))
    if workdir is not None:
        requests += _workdir_request(workdir, [*requests, *user], warn)
    helpers = str(helpers_dir())
    if os.path.isdir(helpers) and not _covered(helpers, [*requests, *user]):
        requests.append(ShareRequest(helpers, helpers, origin="hpcvm helpers"))
    return requests + list(user), links


def _covered(path: str, shares: Sequence[ShareRequest]) -> bool:
    return any(s.host_path == s.guest_path and _within(path, s.host_path) for s in shares)


def _workdir_request(
    workdir: str, taken: Sequence[ShareRequest], warn: Warn | None
) -> list[ShareRequest]:
    """The working directory, read-only, unless it is already visible or is not a job's
    directory but a whole tree of the host (``workdir_refusal``)."""
    real = os.path.realpath(workdir)
    if _covered(real, taken):
        return []
    why = workdir_refusal(real)
    if why is not None:
        if warn:
            hint = share_hint(real)
            warn(f"the working directory {real} is not shared with the guest ({why}): {hint}")
        return []
    return [ShareRequest(real, real, origin="working directory")]


def workdir_refusal(real: str) -> str | None:
    """Why the working directory ``real`` (absolute, symlinks resolved) is not shared
    on its own, or None when it is. The README's "what a guest sees" promises that the
    host's ``/root``, ``/home``, ``/var``, ``/srv``, ``/tmp`` stay out; running hpcvm
    from one of them must not bring it in. So the working directory is shared only when
    it is a job's directory, not:

    - ``/`` or a directory holding hpcvm's runtime directory (the VMs' control sockets);
    - at or below ``/proc``, ``/sys``, ``/dev``, ``/run``: the guest's own there;
    - world-writable (``/tmp``, ``/var/tmp``, a scratch directory): other users' files;
    - a user's home directory (the password database's, ``/root`` too): keys, history;
    - a top-level directory (``/var``, ``/home``, ``/srv``...), a whole tree.

    A directory of one's own below them (``/tmp/job1``, ``~/project``) is shared; any
    directory can still be shared explicitly with ``--share``.
    """
    runtime = _runtime_dir()
    if real == "/":
        return "it is the host's whole root"
    if _within(runtime, real):
        return f"it holds hpcvm's runtime directory {runtime}, the VMs' control sockets"
    if any(_within(real, own) for own in GUEST_RESERVED if own != "/"):
        return "the guest's own /proc, /sys, /dev and /run are there"
    try:
        world_writable = bool(os.stat(real).st_mode & stat.S_IWOTH)
    except OSError:
        world_writable = False
    if world_writable:
        return "it is world-writable: other users' files are there"
    if real in _home_directories():
        return "it is a home directory, with its owner's keys and history"
    if os.path.dirname(real) == "/":
        return "it is a top-level directory: a whole tree of the host, not a job's directory"
    return None


def check_job_dir(workdir: str, specs: Sequence[str]) -> None:
    """Refuse a cluster job run from a directory the guests will not see (commands run
    there inside them), unless a ``--share`` shows it at its own path."""
    real = os.path.realpath(workdir)
    why = workdir_refusal(real)
    if why is None or _covered(real, parse_shares(specs)):
        return
    raise UsageError(
        f"the job's directory {real} is not shared with the guests ({why}), and the job's "
        f"commands run there: {share_hint(real)}"
    )


def _home_directories() -> set[str]:
    homes = set()
    for entry in pwd.getpwall():
        if entry.pw_dir:
            homes.add(os.path.realpath(entry.pw_dir))
    return homes


def etc_hidden(etc: str = ETC) -> tuple[str, ...]:
    """Entries of ``etc`` (relative paths) the guest must not see: the ``ETC_SECRETS``
    and everything not readable by every user (a directory: not searchable by all).
    Nothing below a hidden directory is listed; an unreadable directory is hidden, and
    so is a directory whose every entry is hidden (one whiteout instead of many: each
    costs the guest's init a process at boot). One ``lstat`` per entry (``scandir``):
    this runs at every ``up``."""
    return tuple(sorted(_hidden_in(etc, "")[0]))


def _hidden_in(etc: str, rel_dir: str) -> tuple[list[str], bool]:
    """(hidden entries under ``rel_dir``, whether all of its entries are hidden)."""
    try:
        with os.scandir(os.path.join(etc, rel_dir)) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError:
        return [], False
    hidden: list[str] = []
    all_hidden = bool(entries)
    for entry in entries:
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        kind = "ok" if "\n" in rel else _secret_kind(rel, entry)
        if kind == "dir":
            inner, whole = _hidden_in(etc, rel)
            if whole:
                hidden.append(rel)
            else:
                hidden += inner
                all_hidden = False
        elif kind == "secret":
            hidden.append(rel)
        else:
            all_hidden = False
    return hidden, all_hidden


def _secret_kind(rel: str, entry: os.DirEntry[str]) -> str:
    """``secret``, ``dir`` (a readable directory to look into) or ``ok``."""
    if _SECRETS_RE.match(rel):
        return "secret"
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return "secret"
    if stat.S_ISLNK(st.st_mode):
        return "ok"  # a link's mode means nothing; its target is checked where it is
    is_dir = stat.S_ISDIR(st.st_mode)
    need = 0o005 if is_dir else 0o004
    if st.st_mode & need != need:
        return "secret"
    return "dir" if is_dir else "ok"


def share_list(requests: Sequence[ShareRequest], links: Sequence[GuestLink] = ()) -> ShareList:
    """Tags (``hpcvm0``, ``hpcvm1``...) and ``/etc``'s hidden entries for ``requests``."""
    shares = []
    for index, request in enumerate(requests):
        hide = (
            etc_hidden(request.host_path)
            if request.origin == "system" and (request.host_path == ETC)
            else ()
        )
        shares.append(
            Share(
                host_path=request.host_path,
                guest_path=request.guest_path,
                tag=f"{TAG_PREFIX}{index}",
                writable=request.writable,
                hide=hide,
            )
        )
    return ShareList(tuple(shares), tuple(links), tuple(r.origin for r in requests))


def describe(shares: Sequence[Share], links: Sequence[GuestLink] = ()) -> list[str]:
    """One line per share for ``up`` and ``plan``: guest path, host path when it
    differs, ro/rw, hidden entries."""
    lines = []
    for share in sorted(shares, key=lambda s: s.guest_path):
        where = share.guest_path
        if share.host_path != share.guest_path:
            where += f" <- {share.host_path}"
        mode = "rw" if share.writable else "ro"
        hidden = f", {len(share.hide)} secret entries hidden" if share.hide else ""
        lines.append(f"{where} ({mode}{hidden})")
    lines += [f"{link.guest_path} -> {link.target}" for link in links]
    return lines


def reachable(
    requests: Sequence[ShareRequest],
    user: QemuUser,
    *,
    opened_by_root: bool,
    warn: Warn | None = None,
) -> list[ShareRequest]:
    """``requests`` whose directories QEMU's user can read (and write, for ``:rw``).

    A ``--share`` it cannot reach is a usage error (the guest would see an empty or
    unwritable directory); the working directory or hpcvm's helpers, shared on their
    own, are left out with a warning instead. The system directories are not asked.
    """
    kept = []
    for request in requests:
        if request.origin == "system" or can_access(
            request.host_path, user, write=request.writable, opened_by_root=opened_by_root
        ):
            kept.append(request)
            continue
        what = "write" if request.writable else "read"
        detail = (
            f"QEMU runs as {user.name}, which cannot {what} {request.host_path} "
            f"({describe_mode(request.host_path)})"
        )
        if request.origin == "--share":
            raise UsageError(f"--share {request.host_path}: {detail}; {_grant(request, user)}")
        if warn:
            warn(f"{detail}: the {request.origin} is not shared with the guest")
    return kept


def _grant(request: ShareRequest, user: QemuUser) -> str:
    """The fix that lets QEMU's user reach a share: an ACL, set by the directory's
    owner, so worded for the admin when that is not this user."""
    fix = f"setfacl -m u:{user.name}:{'rwx' if request.writable else 'rx'} {request.host_path}"
    try:
        mine = os.stat(request.host_path).st_uid == os.geteuid()
    except OSError:
        mine = False
    if mine:
        return f"allow it (`{fix}`)"
    return for_admin(f"allow it (`{fix}`)") + " or share a directory of your own"


def preview(
    specs: Sequence[str], workdir: str | None = None, warn: Warn | None = None
) -> list[str]:
    """What a built-in guest started here would see (``describe`` lines), for
    ``hpcvm plan``: ``--share`` checked as ``up`` checks it, minus what only starting
    can tell (whether QEMU's user may reach each directory)."""
    requests, links = builtin_requests(parse_shares(specs), workdir or os.getcwd(), warn)
    listed = share_list(requests, links)
    return describe(listed.shares, listed.links)
