"""hugetlbfs mounts and the files guests keep in them.

QEMU's ``memory-backend-file`` with a directory ``mem-path`` creates a temporary file
there, maps it and unlinks it at once, so a cleanly or uncleanly ended QEMU leaves no
file. To make that checkable, and to clean up after anything that does leave one,
each VM gets its own ``hpcvm-<root token>-<name>-<random>`` directory inside the
mount: removing that directory removes everything the VM could have left.

A mount is used only where others cannot reach into what a user keeps there
(paths.check_dir): root's (or the user's own), and where others may write, sticky, as
the node install mounts it (mode 1770): nobody renames or removes another user's VM
directory. Each VM directory is made 0700 (``mkdtemp``) and checked as private; a
directory that is not this user's private one is never emptied.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.runtime.hostside.paths import check_dir, dir_problem
from hpcvm.units import format_size, parse_size

VM_DIR_PREFIX = "hpcvm-"
_SYS_HUGEPAGES = Path("/sys/kernel/mm/hugepages")


def default_page_size() -> int:
    """The kernel's default huge page size (``Hugepagesize`` in /proc/meminfo)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Hugepagesize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeFailure("this kernel has no huge pages (no Hugepagesize in /proc/meminfo)")


def mounts() -> dict[str, int]:
    """hugetlbfs mount point -> its page size in bytes, from /proc/mounts."""
    found: dict[str, int] = {}
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] != "hugetlbfs":
            continue
        size = default_page_size()
        for opt in fields[3].split(","):
            if opt.startswith("pagesize="):
                size = parse_size(opt.removeprefix("pagesize="), what="hugetlbfs pagesize")
        found[fields[1].replace("\\040", " ")] = size
    return found


GRANT = (
    "an admin mounts one for a group once per node (mount -t hugetlbfs -o "
    "pagesize={page},gid=GROUP,mode=1770 none /dev/hugepages-hpcvm; scripts/install-node.sh; "
    "docs/site.md) and adds you to the group; or plan without huge pages (--page-size 4K, "
    "--profile pinned)"
)


def ensure_mount(path: str, page_size: int) -> None:
    """Make ``path`` a hugetlbfs mount of ``page_size`` pages this process may use,
    mounting one if needed (root only: a user gets the admin's group mount, the grant
    named in the refusal).

    A mount of another page size at ``path`` is an error: QEMU would silently use the
    wrong page size.
    """
    mounted = mounts()
    if path in mounted:
        if mounted[path] != page_size:
            raise RuntimeFailure(
                f"{path} is a hugetlbfs mount of {format_size(mounted[path])} pages, "
                f"the plan needs {format_size(page_size)}: unmount it or mount one elsewhere"
            )
        check_dir(
            Path(path),
            "the hugetlbfs mount",
            "other users could rename or replace the guest memory files kept there; an "
            f"admin remounts it root's with the sticky bit (mount -o remount,mode=1770 {path})",
            owners="me or root",
            sticky_ok=True,
        )
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(
                f"guest memory on {format_size(page_size)} huge pages needs a hugetlbfs "
                f"mount you may write, and {path} is not: "
                + GRANT.format(page=format_size(page_size))
            )
        return
    if os.geteuid() != 0:
        raise UsageError(
            f"guest memory on {format_size(page_size)} huge pages needs a hugetlbfs mount, "
            "and there is none: " + GRANT.format(page=format_size(page_size))
        )
    if not (_SYS_HUGEPAGES / f"hugepages-{page_size // 1024}kB").is_dir():
        raise RuntimeFailure(
            f"this kernel has no {format_size(page_size)} huge pages; choose another --page-size"
        )
    Path(path).mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", "hugetlbfs", "-o", f"pagesize={format_size(page_size)}", "none", path]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeFailure(
            f"cannot mount hugetlbfs at {path} ({detail[-1] if detail else 'mount failed'}); "
            f"run as root: {' '.join(cmd)}"
        )


def vm_dir_prefix(runtime_root: Path, name: str = "") -> str:
    """``hpcvm-<root token>-<name>-``: the token (a hash of the runtime root) keeps the
    directories of same-named VMs of different runtime roots (users, tests) apart."""
    token = hashlib.sha256(str(runtime_root).encode()).hexdigest()[:8]
    return f"{VM_DIR_PREFIX}{token}-{name}-" if name else f"{VM_DIR_PREFIX}{token}-"


def make_vm_dir(mount: str, name: str, runtime_root: Path) -> Path:
    """A private directory for one VM's hugetlbfs files inside ``mount`` (0700, new:
    ``mkdtemp``), checked as private all the same (paths.check_dir)."""
    directory = Path(tempfile.mkdtemp(prefix=vm_dir_prefix(runtime_root, name), dir=mount))
    check_dir(directory, "the VM's hugetlbfs directory", "remove it and run again")
    return directory


def remove_vm_dir(directory: Path) -> None:
    """Delete a VM's hugetlbfs directory and any file in it (frees its pages).

    Refuses directories hpcvm did not make, so a bad record cannot delete other files.
    """
    if not directory.name.startswith(VM_DIR_PREFIX):
        return
    try:
        if dir_problem(directory) is not None:
            return  # not this user's private directory (or not a directory at all)
    except OSError:
        return
    for child in directory.iterdir():
        with contextlib.suppress(FileNotFoundError):
            child.unlink()
    with contextlib.suppress(FileNotFoundError):
        directory.rmdir()


def count_files(mount: str) -> int:
    """Files (not directories) anywhere under a hugetlbfs mount."""
    return sum(len(files) for _root, _dirs, files in os.walk(mount))


def pool_counts(page_size: int) -> tuple[int, int]:
    """(total, free) huge pages of ``page_size`` on the whole host."""
    pool = _SYS_HUGEPAGES / f"hugepages-{page_size // 1024}kB"
    total = int((pool / "nr_hugepages").read_text())
    free = int((pool / "free_hugepages").read_text())
    return total, free
