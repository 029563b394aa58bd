"""The OCI bundle of a benchmark container: its ``config.json``, built here (pure).

What the container sees of the host is what a built-in guest sees (runtime/hostside/shares.py),
at the same paths, so it runs the very binaries and libraries of a native run: the
system directories (``/usr``, ``/lib*``, ``/opt``...; ``/bin``-style symlinks as on the
host), ``/etc`` with its secrets hidden (each hidden file is covered by ``/dev/null``,
each hidden directory by an empty read-only tmpfs), hpcvm's helper programs, the
working directory when it is a job's directory, and the suites' extra directories,
all read-only; plus the run's work directory for this environment, read-write (the
benchmarks write their output files there, as natively). Its own ``/tmp``, ``/dev``,
``/dev/shm`` (a tmpfs without the 64 MiB cap OCI examples give it: MPI's shared memory
needs room, natively it has half of RAM), ``/proc`` and ``/sys``.

Namespaces: mount, PID, IPC and UTS of its own; the host's network (the fair choice
for MPI: the same NICs and paths as native, docs/comparisons.md). Its processes are
confined to the native baseline's PUs and memory nodes by the OCI config's
``linux.resources.cpu`` (``cpus``, ``mems``), which the runtime makes a cgroup of, below
the cgroup hpcvm itself runs in (a relative ``cgroupsPath``): inside a batch job, the
job's cgroup still holds it.

Rootless (hpcvm not root): a user namespace maps the user to root in the container, the
host's ``/sys`` is bound rather than mounted (a user namespace cannot mount sysfs
without a network namespace), and no cgroup is asked for (a user's runtime has no
cpuset to make): bench/envs/container.py then holds each sample by CPU affinity and memory
binding, as a user's native baseline is held.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpcvm.bootspec import GuestLink, Share
from hpcvm.units import format_cpu_list

OCI_VERSION = "1.0.2"
HOSTNAME = "hpcvm-container"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NAMESPACES = ("pid", "ipc", "uts", "mount", "cgroup")  # no "network": the host's
# The kernel files OCI runtimes hide or make read-only by default (runc's spec).
MASKED = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
)
READONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
# What a process in the container may do beyond an unprivileged one's: runc's defaults
# (Docker's, less those a benchmark never needs).
CAPABILITIES = ("CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE")


@dataclass(frozen=True)
class BundleSpec:
    """Everything the config depends on."""

    args: tuple[str, ...]  # the container's first process
    shares: tuple[Share, ...]  # runtime/hostside/shares.py's list (read-only unless writable)
    links: tuple[GuestLink, ...]  # the root's symlinks (/bin -> usr/bin)
    hidden_dirs: frozenset[str]  # of the shares' ``hide`` entries, the directories
    writable: tuple[str, ...]  # host directories bound read-write at their own path
    cpus: tuple[int, ...] | None  # None: not confined
    mems: tuple[int, ...]
    uid: int
    gid: int
    rootless: bool
    hostname: str = HOSTNAME  # its UTS namespace's: a rank's MPI_Get_processor_name
    cgroup: str = "hpcvm-container"  # its cgroup, relative to the one hpcvm runs in


def _bind(source: str, destination: str, *, writable: bool) -> dict[str, Any]:
    options = ["rbind", "rw" if writable else "ro", "nosuid", "nodev"]
    return {"destination": destination, "type": "bind", "source": source, "options": options}


def kernel_mounts(rootless: bool) -> list[dict[str, Any]]:
    """/proc, /dev and its pseudo-terminals, shared memory and message queues, /sys,
    and a /tmp of its own."""
    devpts = ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]
    if not rootless:
        devpts.append("gid=5")  # tty; a user namespace maps no such group
    sys_options = ["nosuid", "noexec", "nodev", "ro"]
    sys_mount: dict[str, Any] = (
        {
            "destination": "/sys",
            "type": "bind",
            "source": "/sys",
            "options": ["rbind", *sys_options],
        }
        if rootless
        else {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": sys_options}
    )
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": devpts},
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "nodev", "mode=1777"],
        },
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        sys_mount,
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        },
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777"],
        },
    ]


def share_mounts(spec: BundleSpec) -> list[dict[str, Any]]:
    """The shares at their paths, then what each hides covered, then the writable
    directories (after the shares, so one below a read-only share is mounted over it)."""
    out: list[dict[str, Any]] = []
    for share in spec.shares:
        out.append(_bind(share.host_path, share.guest_path, writable=share.writable))
        for rel in share.hide:
            where = f"{share.guest_path.rstrip('/')}/{rel}"
            if f"{share.host_path.rstrip('/')}/{rel}" in spec.hidden_dirs:
                out.append(
                    {
                        "destination": where,
                        "type": "tmpfs",
                        "source": "tmpfs",
                        "options": ["ro", "nosuid", "nodev", "noexec", "size=4k", "mode=755"],
                    }
                )
            else:
                out.append(
                    {
                        "destination": where,
                        "type": "bind",
                        "source": "/dev/null",
                        "options": ["bind", "ro", "nosuid", "noexec", "nodev"],
                    }
                )
    out += [_bind(path, path, writable=True) for path in spec.writable]
    return out


def config(spec: BundleSpec) -> dict[str, Any]:
    """The bundle's config.json (module doc)."""
    caps = list(CAPABILITIES)
    linux: dict[str, Any] = {
        "namespaces": [{"type": t} for t in NAMESPACES],
        "maskedPaths": list(MASKED),
        "readonlyPaths": list(READONLY),
    }
    if spec.rootless:
        linux["namespaces"].append({"type": "user"})
        linux["uidMappings"] = [{"containerID": 0, "hostID": spec.uid, "size": 1}]
        linux["gidMappings"] = [{"containerID": 0, "hostID": spec.gid, "size": 1}]
    else:
        # relative: below the cgroup hpcvm runs in (a batch job's), never beside it
        linux["cgroupsPath"] = spec.cgroup
        if spec.cpus is not None:
            linux["resources"] = {
                "cpu": {"cpus": format_cpu_list(spec.cpus), "mems": format_cpu_list(spec.mems)}
            }
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {
                "uid": 0 if spec.rootless else spec.uid,
                "gid": 0 if spec.rootless else spec.gid,
            },
            "args": list(spec.args),
            "env": [f"PATH={PATH}"],
            "cwd": "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": spec.hostname,
        "mounts": [*kernel_mounts(spec.rootless), *share_mounts(spec)],
        "linux": linux,
    }


def describe_mounts(spec: BundleSpec) -> list[str]:
    """What the container sees of the host, one line each, as a VM's shares are told."""
    lines = []
    for share in sorted(spec.shares, key=lambda s: s.guest_path):
        hidden = f", {len(share.hide)} secret entries hidden" if share.hide else ""
        lines.append(f"{share.guest_path} ({'rw' if share.writable else 'ro'}{hidden})")
    lines += [f"{path} (rw)" for path in spec.writable]
    lines += [f"{link.guest_path} -> {link.target}" for link in spec.links]
    return lines


def cpus_text(cpus: Sequence[int] | None) -> str:
    return "any" if cpus is None else format_cpu_list(list(cpus))
