"""Saving and loading a QEMU VM's state (RAM and devices), over QMP.

QEMU 7.2 writes a VM's state only as an outgoing migration, and has no ``file:``
migration URI yet (``migrate`` answers "Parameter 'uri' expects a valid migration
protocol"; measured). ``exec:`` would run a shell command from QEMU, which hpcvm's
seccomp sandbox (``spawn=deny``, render/qemu.py) forbids: QEMU is killed by SIGSYS
(measured). So hpcvm opens the state file itself and hands QEMU the descriptor over the
QMP socket (SCM_RIGHTS, ``getfd``), then migrates to ``fd:NAME``; at restore QEMU starts
with ``-incoming defer`` and the descriptor of the saved file goes the same way to
``migrate-incoming``. QEMU never opens a path, so neither its sandbox nor its
unprivileged user (``-runas``) is in the way, and the file belongs to hpcvm's user.

A paused VM is saved in one pass (no page is dirtied while its vCPUs are stopped), at
disk speed: the migration bandwidth limit (128 MiB/s by default in 7.2) is lifted first.
When the migration completes, QEMU has flushed and released the VM's disks (state
``postmigrate``): the disk overlay can be copied as it is. ``cont`` takes them back.

A live migration (``send``/``receive``) is the same stream over a connection hpcvm made
and authenticated (migration/channel.py), while the VM runs. Its disks do not go in
that stream: QEMU 7.2's block migration refuses a disk served by an I/O thread ("Cannot
change iothread of active block backend", measured), which every tuned profile uses.
The target therefore starts with ``late-block-activate``: QEMU opens its disks only at
``cont``, after hpcvm has written the overlay the source flushed (runtime/migration/move.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcvm.errors import RuntimeFailure
from hpcvm.render.qemu import DEFAULT_BINARY
from hpcvm.runtime.channels import qmp
from hpcvm.runtime.checkpoint.model import Emulator
from hpcvm.runtime.machine.model import Machine

FD_NAME = "hpcvm-state"
UNLIMITED = 1 << 40  # bytes/s: "no limit" for QEMU's max-bandwidth
STALL_TIMEOUT = 120.0  # seconds without a byte of progress before a save is given up
# seconds for a live migration to converge; past it the VM runs on where it was (a
# guest that dirties RAM faster than the network carries it never converges)
MIGRATE_TIMEOUT = 1800.0
LOAD_TIMEOUT = 60.0  # seconds for a load, plus its size at LOAD_FLOOR_RATE
LOAD_FLOOR_RATE = 10 * 1024 * 1024  # bytes/s: slower than any disk a state sits on
_POLL = 0.1
_VERSION_RE = re.compile(r"version (\d+\.\d+\.\d+)\s*(?:\((.*)\))?")
_ALIAS_RE = re.compile(r"^q35\s.*\(alias of (\S+)\)", re.MULTILINE)


class QemuStateSaver:
    """The state of a VM started by the ``qemu`` backend (runtime/backends/qemu_backend.py)."""

    def blockers(self, machine: Machine) -> list[str]:
        """QEMU's own reasons why this VM cannot be saved now (a mounted 9p export,
        a VFIO device without migration support...); empty when it can."""
        status = qmp.execute(_socket(machine), "query-migrate", timeout=10.0)
        return [str(reason) for reason in status.get("blocked-reasons", [])]

    def emulator(self, machine: Machine) -> Emulator:
        """The QEMU that runs ``machine``: its version and resolved machine type."""
        version, machine_type = qmp.execute_many(
            _socket(machine),
            [("query-version", None), ("qom-get", {"path": "/machine", "property": "type"})],
        )
        assert isinstance(version, dict) and isinstance(machine_type, str)
        numbers = version["qemu"]
        return Emulator(
            version=f"{numbers['major']}.{numbers['minor']}.{numbers['micro']}",
            package=str(version.get("package", "")).strip(),
            machine_type=machine_type.removesuffix("-machine"),
        )

    def save(self, machine: Machine, path: Path) -> int:
        """Write the paused VM's state to ``path`` (created, 0600); its size in bytes.

        On failure the migration is cancelled (the VM stays paused, its disks its own)
        and RuntimeFailure says what QEMU reported."""
        sock = _socket(machine)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            qmp.execute(sock, "migrate-set-parameters", {"max-bandwidth": UNLIMITED})
            qmp.execute_many(
                sock, [("getfd", {"fdname": FD_NAME}), ("migrate", {"uri": f"fd:{FD_NAME}"})],
                fd=fd,
            )  # fmt: skip
        finally:
            os.close(fd)  # QEMU holds its own copy until the migration ends
        try:
            _wait_migration(sock, f"saving VM {machine.name}", stall=STALL_TIMEOUT)
        except BaseException:
            with contextlib.suppress(RuntimeFailure):
                qmp.execute(sock, "migrate_cancel", timeout=5.0)
            raise
        return path.stat().st_size

    def send(self, machine: Machine, conn_fd: int) -> dict[str, Any]:
        """Migrate the running VM's RAM and devices over the connected socket
        ``conn_fd``; QEMU's final ``query-migrate`` (``downtime`` in ms). The VM ends
        paused (``postmigrate``), its disks flushed and released; on failure QEMU runs
        it again here."""
        sock = _socket(machine)
        qmp.execute(sock, "migrate-set-parameters", {"max-bandwidth": UNLIMITED})
        qmp.execute_many(
            sock, [("getfd", {"fdname": FD_NAME}), ("migrate", {"uri": f"fd:{FD_NAME}"})],
            fd=conn_fd,
        )  # fmt: skip
        try:
            what = f"migrating VM {machine.name}"
            return _wait_migration(sock, what, stall=STALL_TIMEOUT, deadline=MIGRATE_TIMEOUT)
        except BaseException:
            with contextlib.suppress(RuntimeFailure):
                qmp.execute(sock, "migrate_cancel", timeout=5.0)
            raise

    def receive(
        self, machine: Machine, conn_fd: int, budget: float, listening: Callable[[], None]
    ) -> None:
        """Take an incoming migration from the connected socket ``conn_fd`` into a QEMU
        started with ``-incoming defer``; it stays paused, its disks not yet opened
        (``late-block-activate``: ``cont`` opens them). ``listening()`` runs once QEMU
        reads the connection (the source may send from then on)."""
        sock = _socket(machine)
        caps = [{"capability": "late-block-activate", "state": True}]
        qmp.execute(sock, "migrate-set-capabilities", {"capabilities": caps})
        qmp.execute_many(
            sock,
            [("getfd", {"fdname": FD_NAME}), ("migrate-incoming", {"uri": f"fd:{FD_NAME}"})],
            fd=conn_fd,
        )
        listening()
        _wait_migration(sock, f"receiving VM {machine.name}", deadline=budget)

    def load(self, machine: Machine, path: Path) -> None:
        """Load a saved state into a QEMU started with ``-incoming defer``; it stays
        paused. A state QEMU cannot load makes QEMU exit (7.2): the caller sees it die."""
        sock = _socket(machine)
        fd = os.open(path, os.O_RDONLY)
        try:
            qmp.execute_many(
                sock,
                [("getfd", {"fdname": FD_NAME}), ("migrate-incoming", {"uri": f"fd:{FD_NAME}"})],
                fd=fd,
            )
        finally:
            os.close(fd)
        budget = LOAD_TIMEOUT + path.stat().st_size / LOAD_FLOOR_RATE
        _wait_migration(sock, f"loading the state of VM {machine.name}", deadline=budget)


def emulator_here(binary: str = DEFAULT_BINARY) -> Emulator:
    """The QEMU a restore on this host would start: ``--version`` and what ``q35``
    stands for in ``-machine help``. Asked of the binary, so nothing is started."""
    version = _ask(binary, "--version")
    match = _VERSION_RE.search(version)
    machines = _ALIAS_RE.search(_ask(binary, "-machine", "help"))
    if match is None or machines is None:
        raise RuntimeFailure(f"cannot tell the version and q35 machine type of {binary}")
    return Emulator(
        version=match.group(1), package=(match.group(2) or "").strip(), machine_type=machines[1]
    )


def _ask(binary: str, *args: str) -> str:
    try:
        done = subprocess.run(
            [binary, *args], capture_output=True, text=True, timeout=30.0, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeFailure(f"cannot run {binary} {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeFailure(f"{binary} {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _wait_migration(
    sock: Path, what: str, *, stall: float | None = None, deadline: float | None = None
) -> dict[str, Any]:
    """Poll ``query-migrate`` until the migration completed; RuntimeFailure with QEMU's
    error when it failed, when no byte moved for ``stall`` seconds (an outgoing
    migration counts its bytes) or after ``deadline`` seconds (an incoming one does not).
    """
    begin = time.monotonic()
    moved, last_change = -1, begin
    while True:
        status: dict[str, Any] = qmp.execute(sock, "query-migrate", timeout=10.0)
        state = status.get("status")
        if state == "completed":
            return status
        if state in ("failed", "cancelled"):
            detail = status.get("error-desc") or state
            raise RuntimeFailure(f"{what} failed: QEMU says: {detail}", cause="qemu")
        now = time.monotonic()
        transferred = int(status.get("ram", {}).get("transferred", 0))
        if transferred != moved:
            moved, last_change = transferred, now
        elif stall is not None and now - last_change > stall:
            raise RuntimeFailure(
                f"{what} made no progress for {stall:.0f} s (status {state}, {moved} bytes "
                "moved): is the directory's file system full or hung?"
            )
        if deadline is not None and now - begin > deadline:
            raise RuntimeFailure(f"{what} did not finish within {deadline:.0f} s ({state})")
        time.sleep(_POLL)


def _socket(machine: Machine) -> Path:
    if not machine.boot.qmp_socket:
        raise RuntimeFailure(f"VM {machine.name} has no QMP socket in its record")
    return Path(machine.boot.qmp_socket)
