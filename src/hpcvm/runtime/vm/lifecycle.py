"""up / exec / down: the runtime's orchestration, used by the CLI and by ``bench``.

``up`` refuses everything it can before anything starts (name in use, missing boot
media, a missing bridge or a bad address, an infeasible plan), then starts QEMU paused,
pins its threads (and connects its NICs, runtime/net/network.py) while no vCPU has run yet,
resumes it, waits for the guest agent and checks from inside that the guest's NICs are
configured. Whatever goes wrong after QEMU exists
— QEMU dying, the agent never answering, a pinning that did not take, Ctrl-C — tears
the VM down completely before the error propagates: a failed ``up`` leaves nothing.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hpcvm import timeline
from hpcvm.bootspec import Nic
from hpcvm.errors import HpcvmError, RuntimeFailure, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import PlanRequest, VMPlan
from hpcvm.runtime.backends.registry import get_backend
from hpcvm.runtime.hostside import memory_files, paths, pinning
from hpcvm.runtime.hostside import shares as sharing
from hpcvm.runtime.hostside.confine import QemuUser
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Backend, ExecResult, Machine
from hpcvm.runtime.machine.options import UpOptions, VmOptions
from hpcvm.runtime.machine.planning import Warn, make_plan, placement_lock
from hpcvm.runtime.machine.planning import plan_same_guest as plan_same_guest  # re-exported
from hpcvm.runtime.machine.timeouts import DOWN_TIMEOUT as DOWN_TIMEOUT  # re-exported
from hpcvm.runtime.machine.timeouts import ENV_READY_TIMEOUT as ENV_READY_TIMEOUT
from hpcvm.runtime.machine.timeouts import EXEC_TIMEOUT_EXIT as EXEC_TIMEOUT_EXIT
from hpcvm.runtime.machine.timeouts import PROMPT_POLL
from hpcvm.runtime.machine.timeouts import READY_TIMEOUT as READY_TIMEOUT
from hpcvm.runtime.net import network, vm_nics
from hpcvm.runtime.net.vm_nics import DISK_ADDRESS_WARNING as DISK_ADDRESS_WARNING
from hpcvm.runtime.vm.boot import (
    BootMedia,
    confined,
    in_run_dir,
    resolve_boot_media,
    with_guest_kernel_args,
    with_shares,
)
from hpcvm.runtime.vm.run_dir import claimed_run_dir, refuse_if_in_use
from hpcvm.runtime.vm.stopping import teardown
from hpcvm.signals import signals_deferred

if TYPE_CHECKING:
    from hpcvm.runtime.channels.agent import GuestAgent

ADDRESS_IN_USE_FILE = "/run/hpcvm/address-in-use"  # written by the guest (guest/scripts.py)
NETWORK_DONE_FILE = "/run/hpcvm/network-done"  # the guest's rc, once its NICs are set up


# -- up -----------------------------------------------------------------------------------


def up(
    target: PlanRequest | VMPlan,
    options: UpOptions,
    *,
    host: HostTopology | None = None,
    warn: Warn | None = None,
    media: BootMedia | None = None,
    load_state: Callable[[Machine], None] | None = None,
) -> Machine:
    """Start a VM for a request (planned here) or a ready plan; return when the guest
    agent answers. Raises HpcvmError (one line) with nothing left behind on failure.

    A restore (runtime/checkpoint/save_restore.py) gives the boot ``media`` itself (instead of
    those ``options`` name) and ``load_state``, called once QEMU runs paused and is
    pinned, before its vCPUs run: it loads the saved state into that QEMU."""
    timeline.mark_process_start("up: process start")
    timeline.mark("up: entered")
    name = paths.check_name(options.name)
    requests = sharing.parse_shares(options.shares)
    refuse_if_in_use(name)
    if media is None:
        media = resolve_boot_media(
            kernel=options.kernel, initrd=options.initrd, image=options.image
        )
    nics = nics_for(options, name, warn)
    with contextlib.ExitStack() as placing:
        if isinstance(target, PlanRequest):
            placing.enter_context(placement_lock())
            request = vm_nics.with_vfs(target.model_copy(update={"name": name}), nics)
            plan = make_plan(request, host=host, kernel=media.kernel, warn=warn)
            timeline.mark("up: planned")
        else:
            plan = vm_nics.plan_has_vfs(target, nics)
        backend = get_backend(options.backend, options.connect_uri)
        user = backend.qemu_user()
        media = with_shares(
            media,
            requests,
            workdir=options.workdir or os.getcwd(),
            user=user,
            opened_by_root=backend.opens_shares_as_root and user.switch,
            warn=warn,
        )
        media = replace(media, boot=vm_nics.on_boot(media.boot, nics, warn))
        memory_files.ensure_mounts(plan)
        ready_timeout = _ready_timeout(options, plan, media)
        with claimed_run_dir(name) as run_dir:
            machine = _new_machine(name, run_dir, plan, media, backend, options, user)
            placing.close()  # its record is written: the next up plans beside this VM
            try:
                return _start(machine, backend, ready_timeout, load_state)
            except BaseException as exc:
                with signals_deferred():
                    teardown(machine, backend, keep_logs=not _interrupted(exc))
                failure = _as_failure(exc, machine, backend)
                if failure is exc:
                    raise
                raise failure from exc


def nics_for(options: VmOptions, name: str, warn: Warn | None = None) -> tuple[Nic, ...]:
    """The NICs ``up`` makes for a VM called ``name`` booted with ``options`` (with
    UpOptions, the MAC it keeps when it migrated in)."""
    return network.resolve_nics(
        options.network,
        options.address,
        vm=name,
        privileged=network.is_root() or get_backend(options.backend).nics_by_daemon,
        warn=warn,
        mac=options.mac if isinstance(options, UpOptions) else None,
    )


def _new_machine(
    name: str,
    run_dir: Path,
    plan: VMPlan,
    media: BootMedia,
    backend: Backend,
    options: UpOptions,
    user: QemuUser,
) -> Machine:
    """The record before QEMU starts: sockets and logs in the run dir, for the QEMU
    backend a private hugetlbfs directory per mount (hostside/memory_files.py), QEMU's user
    and sandbox, and for an hpc plan its guest kernel arguments."""
    media_boot = in_run_dir(media, run_dir, name)  # first: it may fail, leaving only run_dir
    vm_dirs: list[str] = []
    if backend.private_hugetlbfs:
        plan, vm_dirs = memory_files.private_dirs(plan, name)
    boot = media_boot.model_copy(
        update={
            "agent_socket": str(run_dir / paths.AGENT_SOCKET),
            "done_socket": str(run_dir / paths.DONE_SOCKET),
            "qmp_socket": str(run_dir / paths.QMP_SOCKET),
            "serial_log": str(run_dir / paths.CONSOLE_LOG),
            "pidfile": str(run_dir / paths.PID_FILE),
            "paused": True,  # pin before any vCPU runs, then resume
        }
    )
    boot = with_guest_kernel_args(
        confined(boot, backend.confines_itself, user), plan.guest_kernel_args
    )
    machine = Machine(
        name=name,
        backend=backend.name,
        run_dir=str(run_dir),
        pid=None,
        started_at=time.time(),
        plan=plan,
        boot=boot,
        image=media.label,
        connect_uri=options.connect_uri,
        hugetlbfs_dirs=tuple(vm_dirs),
        options=VmOptions.model_validate(options.model_dump(include=set(VmOptions.model_fields))),
        host=socket.gethostname(),
    )
    state.save_machine(machine)
    return machine


def _ready_timeout(options: UpOptions, plan: VMPlan, media: BootMedia) -> float:
    if options.ready_timeout is not None:
        return options.ready_timeout
    from_env = env_ready_timeout()
    if from_env is not None:
        return from_env
    return (media.ready_timeouts or READY_TIMEOUT)[plan.accel]


def env_ready_timeout() -> float | None:
    """``$HPCVM_READY_TIMEOUT`` in seconds, None when unset; a value that is not a
    finite number above zero is refused before anything starts (a deadline already past
    would start QEMU only to tear it down)."""
    env = os.environ.get(ENV_READY_TIMEOUT)
    if not env:
        return None
    try:
        seconds = float(env)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"{ENV_READY_TIMEOUT}={env!r} is not a positive number of seconds")
    return seconds


def _start(
    machine: Machine,
    backend: Backend,
    ready_timeout: float,
    load_state: Callable[[Machine], None] | None = None,
) -> Machine:
    # A SIGTERM between QEMU's start and its record would leave a QEMU nobody knows
    # (teardown finds no pid): the signal waits until the record is written.
    with signals_deferred():
        started = backend.start(machine)
        state.save_machine(started)  # from here on `down` can clean up after us
    timeline.mark("up: qemu started")
    assert started.pid is not None
    threads = backend.vcpu_threads(started)
    if backend.pins_itself:
        pinning.check(started.plan, started.pid, threads)
    else:
        pinning.pin(started.plan, started.pid, threads)
    if load_state is not None:
        load_state(started)
    if started.boot.paused:
        backend.resume(started)
    _wait_for_agent(started, backend, time.monotonic() + ready_timeout, ready_timeout)
    timeline.mark("up: agent answered")
    _check_guest_nics(started)
    timeline.mark("up: guest NICs checked")
    return started


def _check_guest_nics(machine: Machine) -> None:
    """When the guest configured its NICs itself (``hpcvm.net=``), check from inside
    that it did: a VM that is up without its network would fail only later, in the
    middle of an MPI job on several hosts. One agent call, only for VMs with NICs."""
    from hpcvm.runtime.verify.nics import check_nics
    from hpcvm.runtime.vm.guest_exec import connected

    if not machine.boot.nics or not machine.boot.share_table:
        return
    with connected(machine, timeout=60.0) as agent:
        _wait_network_done(agent)
        timeline.mark("up: guest network done")
        prompt = _Prompt(agent)
        failed = [c for c in check_nics(machine.boot.nics, prompt) if not c.ok]
        taken = _addresses_in_use(agent) if failed else []
    if taken:
        raise RuntimeFailure(
            f"address {', '.join(taken)} is in use on the segment already (the guest's "
            "duplicate address detection got an answer): choose another --address",
            cause=network.ADDRESS_IN_USE,
        )
    if failed:
        what = "; ".join(f"{c.name}: expected {c.expected}, got {c.actual}" for c in failed)
        raise RuntimeFailure(
            f"the guest did not configure its network ({what}); see the console log "
            f"{_kept_console(machine)}"
        )


class _Prompt:
    """The agent's exec, its end asked for every ``PROMPT_POLL`` s: ``up`` waits for it
    (an ``ip`` run of 0.3-0.5 s under TCG was found up to 0.1 s late at the default)."""

    def __init__(self, agent: GuestAgent) -> None:
        self.agent = agent

    def exec(self, argv: list[str], timeout: float | None = None) -> ExecResult:
        return self.agent.exec(argv, timeout, poll_max=PROMPT_POLL)


def _wait_network_done(agent: GuestAgent, limit: float = 30.0) -> None:
    """Wait until the guest's rc has set its NICs up (probe included, in the background
    of its boot); after ``limit`` s the NIC check says what is missing."""
    until = time.monotonic() + limit
    while time.monotonic() < until and _guest_file(agent, NETWORK_DONE_FILE) is None:
        time.sleep(0.02)


def _addresses_in_use(agent: GuestAgent) -> list[str]:
    """The addresses the guest found taken at boot (guest/scripts.py), if any."""
    text = _guest_file(agent, ADDRESS_IN_USE_FILE)
    return [] if text is None else text.decode(errors="replace").split()


def _guest_file(agent: GuestAgent, path: str) -> bytes | None:
    """A marker file the guest's rc writes, or None while it does not exist."""
    from hpcvm.runtime.channels.agent import AgentCommandError

    try:
        return agent.read_file(path)
    except AgentCommandError:
        return None


def _kept_console(machine: Machine) -> Path:
    """The console log as a failed ``up`` keeps it: ``up`` tears the VM down before its
    error is printed, so the message names where the log will be (teardown's
    ``keep_logs``), not the run directory that is about to go."""
    return paths.kept_log(machine.name, paths.CONSOLE_LOG)


def _wait_for_agent(machine: Machine, backend: Backend, deadline: float, budget: float) -> None:
    from hpcvm.runtime.channels.agent import GuestAgent

    assert machine.boot.agent_socket is not None
    agent = GuestAgent(
        machine.boot.agent_socket, timeout=budget, console_log=machine.boot.serial_log
    )
    try:
        agent.wait_ready(deadline, lambda: backend.alive(machine))
    except HpcvmError as exc:
        if not backend.alive(machine):
            raise RuntimeFailure(_death(machine, backend), cause="qemu") from exc
        raise RuntimeFailure(
            f"the guest agent did not answer within {budget:.0f} s; see the console log "
            f"{_kept_console(machine)}"
        ) from exc
    finally:
        agent.close()


def _death(machine: Machine, backend: Backend) -> str:
    return backend.death_message(machine)


def _as_failure(exc: BaseException, machine: Machine, backend: Backend) -> BaseException:
    """The error to report for a failed start: QEMU's death beats its symptoms."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return exc
    if isinstance(exc, HpcvmError) and exc.cause == "qemu":
        return exc  # already QEMU's own account of what happened
    if backend.exit_code(machine) is not None:
        return RuntimeFailure(_death(machine, backend))
    if isinstance(exc, HpcvmError):
        return exc
    return RuntimeFailure(f"starting VM {machine.name} failed: {type(exc).__name__}: {exc}")


def _interrupted(exc: BaseException) -> bool:
    return isinstance(exc, KeyboardInterrupt | SystemExit)
