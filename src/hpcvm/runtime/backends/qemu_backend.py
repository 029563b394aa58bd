"""The QEMU backend: QEMU started directly from the plan's command line, driven over QMP.

QEMU starts as hpcvm's user and, when that is root, drops to ``hpcvm-qemu`` with
``-runas`` once it has opened what needs root; it always runs under its seccomp sandbox
(render/qemu.py ``_confine``, runtime/hostside/confine.py).

QEMU runs as a child detached into its own session (so it outlives ``hpcvm up`` and a
Ctrl-C in the terminal does not reach it), with its stdout/stderr in ``qemu.log`` in the
VM's directory. When the plan restricts QEMU's own threads (``emulator_pus``), QEMU
starts with that affinity already, so none of its threads ever runs on a vCPU's PU.

A bridge NIC's tap is created by QEMU itself (``-netdev tap,ifname=``) and put into its
bridge here once QMP answers, while the vCPUs are still stopped; it is not persistent, so
the kernel removes it whenever QEMU exits. A macvtap is made and opened here before QEMU
starts (QEMU cannot create one) and its descriptors inherited (``fd=``, ``vhostfd=``);
the link outlives QEMU and is removed by the lifecycle (runtime/net/network.py).

The built-in guest's read-only shares are served as one 9p export assembled in a
private mount namespace QEMU starts in (runtime/hostside/staging.py); the record keeps the list.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.backends import qemu_process
from hpcvm.runtime.backends.qemu_process import wait_gone as wait_gone  # re-exported
from hpcvm.runtime.channels import agent_relay, qmp
from hpcvm.runtime.hostside import paths, staging
from hpcvm.runtime.hostside.confine import QemuUser, qemu_user
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.net import network

STARTUP_TIMEOUT = 60.0  # QEMU up to its QMP socket; huge page preallocation can be slow
_POLL = 0.01  # QMP socket checks while QEMU starts: each is a stat, waiting is boot time


def log_tail(path: Path, lines: int = 4) -> str:
    """The last non-empty lines of a log, joined into one line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) if kept else "(empty log)"


class QemuBackend:
    """Backend protocol implementation for a bare QEMU process (see runtime/machine/model.py)."""

    name: str = "qemu"
    pins_itself = False  # the runtime pins vCPU and emulator threads (runtime/hostside/pinning.py)
    opens_shares_as_root = True  # -runas: QEMU opens its shares before dropping to its user
    confines_itself = False  # hpcvm adds -runas and -sandbox (runtime/vm/boot.py confined)
    private_hugetlbfs = True  # hpcvm's per-VM hugetlbfs directories (hostside/hugetlbfs.py)
    nics_by_daemon = False  # hpcvm (root) makes the host side; QEMU opens taps by name

    def __init__(self, connect_uri: str | None = None) -> None:
        # connect_uri is a libvirt notion; accepted so every backend is built alike.
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def qemu_user(self) -> QemuUser:
        """``hpcvm-qemu`` when hpcvm is root (``-runas``), else the caller (hostside/confine.py)."""
        return qemu_user()

    # -- start ------------------------------------------------------------------------

    def start(self, machine: Machine) -> Machine:
        """Make and open the NICs QEMU cannot open itself (macvtap), start QEMU with
        them inherited, wait for QMP, attach the taps QEMU made. On any failure QEMU is
        killed and what was made for it removed."""
        run_dir = Path(machine.run_dir)
        opened = network.open_nics(machine.boot.nics, run_dir)
        try:
            proc = self._spawn(machine, opened)
        except BaseException:
            network.release_nics(machine.boot.nics)
            raise
        finally:
            network.close_fds(opened)  # QEMU holds its own copies now
        self._children[proc.pid] = proc
        nics = network.with_names(machine.boot.nics, opened)  # a bridge helper's tap names
        boot = machine.boot.model_copy(update={"nics": nics})
        started = machine.model_copy(update={"pid": proc.pid, "boot": boot})
        try:
            self._wait_for_qmp(started, proc)
            network.attach_nics(nics)  # QEMU made the taps; the guest waits (-S)
        except BaseException:
            _kill(proc)
            network.release_nics(machine.boot.nics)
            raise
        for sock in (machine.boot.qmp_socket, machine.boot.agent_socket, machine.boot.done_socket):
            if sock:
                paths.make_private(Path(sock))
        self._start_relay(started)
        return started

    def _start_relay(self, machine: Machine) -> None:
        """Start the guest agent's relay (channels/agent_relay.py), dropped to QEMU's
        user when hpcvm is root. Without one the agent still serves, on QEMU's socket,
        only slower to a new client: a relay that does not start is said in qemu.log."""
        agent = machine.boot.agent_socket
        relay = paths.agent_relay(agent) if agent else None
        if agent is None or relay is None:
            return
        user = self.qemu_user()
        ids = (user.uid, user.gid) if user.switch else (None, None)
        try:
            agent_relay.start(Path(agent), relay, uid=ids[0], gid=ids[1])
        except OSError as exc:
            with open(Path(machine.run_dir) / paths.QEMU_LOG, "a") as log:
                log.write(f"hpcvm: no agent relay ({exc}); clients use {agent}\n")

    def _spawn(
        self, machine: Machine, opened: dict[int, network.NicFds]
    ) -> subprocess.Popen[bytes]:
        from hpcvm.render.qemu import qemu_argv  # the renderer owns the command line

        run_dir = Path(machine.run_dir)
        staged = staging.stage(machine.boot, run_dir)  # one 9p export where it can be
        boot = machine.boot if staged is None else staged.boot
        boot = boot.model_copy(update={"nics": network.with_fds(machine.boot.nics, opened)})
        argv = qemu_argv(machine.plan, boot)
        with open(run_dir / paths.QEMU_LOG, "ab") as log:
            return subprocess.Popen(
                argv if staged is None else staging.wrap(argv, staged),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=run_dir,
                start_new_session=True,
                pass_fds=[fd for fds in opened.values() for fd in fds.all()],
                preexec_fn=_before_exec(machine.plan.emulator_pus, machine.plan.host_thp),
            )

    def _wait_for_qmp(self, machine: Machine, proc: subprocess.Popen[bytes]) -> None:
        """Return when QMP answers; fail with QEMU's exit code and log if it dies."""
        sock = _qmp_socket(machine)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeFailure(self.death_message(machine), cause="qemu")
            if sock.exists():
                try:
                    qmp.execute(sock, "query-status", timeout=5.0)
                    return
                except RuntimeFailure:
                    if proc.poll() is not None:
                        raise RuntimeFailure(self.death_message(machine), cause="qemu") from None
            if time.monotonic() > deadline:
                raise RuntimeFailure(
                    f"QEMU did not open its QMP socket within {STARTUP_TIMEOUT:.0f} s; "
                    f"see {paths.kept_log(machine.name, paths.QEMU_LOG)}",
                    cause="qemu",
                )
            time.sleep(_POLL)

    def exit_code(self, machine: Machine) -> int | None:
        """QEMU's exit code when this process started it and it has exited."""
        proc = self._children.get(machine.pid or -1)
        return None if proc is None else proc.poll()

    def death_message(self, machine: Machine) -> str:
        """One line for a QEMU that died while ``up`` started it: exit code (when known)
        and its log's tail, read where the log is now; the path named is where the
        failed ``up`` keeps the log after tearing the VM down (paths.kept_log)."""
        code = self.exit_code(machine)
        how = f"exited with code {code}" if code is not None else "exited"
        if code is not None and code < 0:
            how = f"was killed by signal {-code}"
        tail = log_tail(paths.log_now(Path(machine.run_dir), machine.name, paths.QEMU_LOG))
        kept = paths.kept_log(machine.name, paths.QEMU_LOG)
        return f"QEMU (pid {machine.pid}) {how}: {tail} (log: {kept})"

    # -- queries ----------------------------------------------------------------------

    def vcpu_threads(self, machine: Machine) -> dict[int, int]:
        cpus = qmp.execute(_qmp_socket(machine), "query-cpus-fast")
        return {int(c["cpu-index"]): int(c["thread-id"]) for c in cpus}

    def alive(self, machine: Machine) -> bool:
        """Whether its QEMU runs. A QEMU this process started is asked through its
        ``Popen``, which collects the exit status for ``death_message``: reaping the pid
        behind its back would leave Popen an exit code of 0 for a QEMU that crashed."""
        proc = self._children.get(machine.pid or -1)
        if proc is not None:
            return proc.poll() is None
        return state.machine_process_alive(machine)[0]

    def qmp(
        self, machine: Machine, command: str, arguments: dict[str, object] | None = None
    ) -> Any:
        return qmp.execute(_qmp_socket(machine), command, arguments)

    def status(self, machine: Machine) -> Literal["running", "paused"]:
        """Whether the guest's vCPUs run (QMP query-status)."""
        result = qmp.execute(_qmp_socket(machine), "query-status", timeout=5.0)
        return "running" if result.get("running") else "paused"

    def pause(self, machine: Machine) -> None:
        qmp.execute(_qmp_socket(machine), "stop")

    def resume(self, machine: Machine) -> None:
        qmp.execute(_qmp_socket(machine), "cont")

    # -- stop -------------------------------------------------------------------------

    def stop(self, machine: Machine, *, timeout: float) -> None:
        """QMP quit, then SIGKILL after ``timeout``; then remove the sockets
        (runtime/backends/qemu_process.py, which ``hpcvm down`` uses on a record read
        without the models)."""
        boot = machine.boot
        qemu_process.stop(
            machine.pid,
            (boot.qmp_socket, boot.agent_socket, boot.done_socket),
            timeout=timeout,
            alive=lambda: self.alive(machine),
            quit=lambda seconds: qmp.execute(_qmp_socket(machine), "quit", timeout=seconds),
            forget=lambda: self._forget(machine),
        )

    def kill(self, machine: Machine) -> None:
        """SIGKILL QEMU (only if the pid is still this VM's QEMU) and wait for it, and
        for its agent relay."""
        qemu_process.kill(
            machine.pid, alive=lambda: self.alive(machine), forget=lambda: self._forget(machine)
        )
        qemu_process.end_relay(machine.boot.agent_socket)

    def _forget(self, machine: Machine) -> None:
        proc = self._children.pop(machine.pid or -1, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)


def _qmp_socket(machine: Machine) -> Path:
    if not machine.boot.qmp_socket:
        raise RuntimeFailure(f"VM {machine.name} has no QMP socket in its record")
    return Path(machine.boot.qmp_socket)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30.0)


PR_SET_THP_DISABLE = 41  # linux/prctl.h: inherited across fork and kept across execve


def _before_exec(pus: tuple[int, ...], host_thp: bool) -> Callable[[], None] | None:
    """A pre-exec hook giving QEMU the emulator PUs from its first instruction and,
    for a plan on the host's 4K pages by name, no transparent huge pages (plan/model.py
    ``host_thp``)."""
    if not pus and host_thp:
        return None
    cpus = set(pus)
    libc = None if host_thp else ctypes.CDLL(None, use_errno=True)

    def _set() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        if libc is not None and libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE)")

    return _set
