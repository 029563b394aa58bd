"""Fixtures for tests that use the real machine: a running libvirtd, huge pages.

``libvirtd`` (session): makes sure a libvirtd serves ``qemu:///system`` and returns that
URI. If none answers, it starts ``libvirtd -d`` (as on this machine, where there is no
systemd) and waits for the socket; whether libvirtd answered or not, it starts
``virtlogd -d`` when nothing accepts a connection on virtlogd's socket (a socket file
left by a virtlogd that died is not a daemon: libvirtd then cannot start any domain). At
the end of the session it stops the daemons it started (and only those), so a test run
leaves no process behind. A daemon that was already running (systemd's, or another
session's) is left alone.

``hugepages`` (session): a ``HugePages`` helper. ``ensure_free(page_size, count)``
raises the kernel's pool by what is missing (never lowers it) and mounts hugetlbfs at
/dev/hugepages (2M) if nothing is mounted there; at the end of the session the pool is
lowered by what this session added, never below the value found. The mount stays: it
is what systemd would provide and other sessions may be using it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

LIBVIRT_URI = "qemu:///system"
LIBVIRT_SOCK = Path("/run/libvirt/libvirt-sock")
VIRTLOGD_SOCK = Path("/run/libvirt/virtlogd-sock")
DAEMON_TIMEOUT = 120.0  # the machine is shared and slow; libvirtd probes QEMU at start
SYS_HUGEPAGES = Path("/sys/kernel/mm/hugepages")
HUGETLBFS_2M = "/dev/hugepages"


def _virsh_answers(uri: str) -> bool:
    proc = subprocess.run(
        ["virsh", "-c", uri, "uri"], capture_output=True, text=True, timeout=60, check=False
    )
    return proc.returncode == 0


def _listens(path: Path) -> bool:
    """Whether a daemon accepts connections on a unix socket (not just a file there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _start_daemon(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


@pytest.fixture(scope="session")
def libvirtd() -> Iterator[str]:
    """A real libvirtd on qemu:///system (started if needed, stopped if we started it)."""
    for tool in ("libvirtd", "virtlogd", "virsh"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: run scripts/setup.sh (libvirt-daemon-system)")
    started: list[str] = []
    if not _listens(VIRTLOGD_SOCK):
        VIRTLOGD_SOCK.unlink(missing_ok=True)
        _start_daemon(["virtlogd", "-d"])
        started.append("virtlogd")
    try:
        if not (LIBVIRT_SOCK.exists() and _virsh_answers(LIBVIRT_URI)):
            _start_daemon(["libvirtd", "-d"])
            started.insert(0, "libvirtd")
            _wait_for_libvirtd()
        _wait_for(VIRTLOGD_SOCK)
        yield LIBVIRT_URI
    finally:
        for name in started:
            _stop_daemon(name)


def _wait_for_libvirtd() -> None:
    deadline = time.monotonic() + DAEMON_TIMEOUT
    while time.monotonic() < deadline:
        if LIBVIRT_SOCK.exists() and _virsh_answers(LIBVIRT_URI):
            return
        time.sleep(0.5)
    pytest.fail(f"libvirtd did not answer on {LIBVIRT_URI} within {DAEMON_TIMEOUT:.0f} s")


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + DAEMON_TIMEOUT
    while not _listens(path):
        if time.monotonic() > deadline:
            pytest.fail(f"nothing listens on {path} within {DAEMON_TIMEOUT:.0f} s")
        time.sleep(0.2)


def _stop_daemon(name: str) -> None:
    """SIGTERM a daemon this session started (its pidfile is /run/<name>.pid); wait."""
    pidfile = Path(f"/run/{name}.pid")
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


@pytest.fixture(scope="session")
def guest() -> None:
    """Build the built-in guest once, so no test's timing includes the build."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("hpcvm")), "guest", "build"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr


class HugePages:
    """Raise the huge page pool for a test, only ever upwards; undo at session end."""

    def __init__(self) -> None:
        self.found: dict[int, int] = {}  # page size -> nr_hugepages when first touched
        self.added: dict[int, int] = {}

    @staticmethod
    def _pool(page_size: int) -> Path:
        return SYS_HUGEPAGES / f"hugepages-{page_size // 1024}kB"

    def counts(self, page_size: int) -> tuple[int, int]:
        """(nr_hugepages, free_hugepages) of one size, host-wide."""
        pool = self._pool(page_size)
        return int((pool / "nr_hugepages").read_text()), int((pool / "free_hugepages").read_text())

    def ensure_free(self, page_size: int, count: int) -> None:
        """At least ``count`` free pages of ``page_size`` (and a 2M mount to use them)."""
        total, free = self.counts(page_size)
        self.found.setdefault(page_size, total)
        if free < count:
            want = total + count - free
            (self._pool(page_size) / "nr_hugepages").write_text(f"{want}\n")
            got, free = self.counts(page_size)
            self.added[page_size] = self.added.get(page_size, 0) + max(0, got - total)
            if free < count:
                pytest.fail(
                    f"could reserve only {free} of {count} free {page_size // 1024} KiB huge "
                    "pages (memory fragmented or used by others)"
                )
        if page_size == 2 * 1024 * 1024:
            _ensure_mount(HUGETLBFS_2M, "2M")

    def restore(self) -> None:
        for page_size, added in self.added.items():
            total, _ = self.counts(page_size)
            target = max(self.found[page_size], total - added)
            if target < total:
                (self._pool(page_size) / "nr_hugepages").write_text(f"{target}\n")


def _mounted_hugetlbfs(path: str) -> bool:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[1] == path and fields[2] == "hugetlbfs":
            return True
    return False


def _ensure_mount(path: str, page: str) -> None:
    if _mounted_hugetlbfs(path):
        return
    os.makedirs(path, exist_ok=True)
    cmd = ["mount", "-t", "hugetlbfs", "-o", f"pagesize={page}", "none", path]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 and not _mounted_hugetlbfs(path):  # another session won the race
        pytest.fail(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")


@pytest.fixture(scope="session")
def hugepages() -> Iterator[HugePages]:
    """See the module docstring; needs root (as all integration tests here)."""
    pages = HugePages()
    try:
        yield pages
    finally:
        pages.restore()
