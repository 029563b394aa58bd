"""up: one VM's start, used by the CLI, by ``bench``, a restore and a migration's
receiving side; this module ties its steps together and writes the VM's record.

``up`` refuses everything it can before anything starts (name in use, missing boot
media, a missing bridge or a bad address, an infeasible plan), then starts QEMU paused,
pins its threads (and connects its NICs, runtime/net/network.py) while no vCPU has run yet,
resumes it, waits for the guest agent and checks from inside that the guest's NICs are
configured. Whatever goes wrong after QEMU exists
— QEMU dying, the agent never answering, a pinning that did not take, Ctrl-C — tears
the VM down completely before the error propagates: a failed ``up`` leaves nothing.

The steps are owned elsewhere: the plan beside the live VMs and the lock that keeps it
true (runtime/machine/planning.py), the NICs in the plan and on the boot spec
(runtime/net/vm_nics.py), the run directory (runtime/vm/run_dir.py), the huge page
files (runtime/hostside/memory_files.py), and when the guest is ready
(runtime/vm/readiness.py, with the guest's marker files: runtime/channels/guest_markers.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from hpcvm import timeline
from hpcvm.bootspec import Nic
from hpcvm.errors import HpcvmError, RuntimeFailure
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import PlanRequest, VMPlan
from hpcvm.runtime.backends.registry import get_backend
from hpcvm.runtime.hostside import memory_files, paths, pinning
from hpcvm.runtime.hostside import shares as sharing
from hpcvm.runtime.hostside.confine import QemuUser
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Backend, Machine
from hpcvm.runtime.machine.options import UpOptions, VmOptions
from hpcvm.runtime.machine.planning import Warn, make_plan, placement_lock
from hpcvm.runtime.machine.timeouts import DOWN_TIMEOUT as DOWN_TIMEOUT  # re-exported
from hpcvm.runtime.machine.timeouts import ENV_READY_TIMEOUT as ENV_READY_TIMEOUT
from hpcvm.runtime.machine.timeouts import EXEC_TIMEOUT_EXIT as EXEC_TIMEOUT_EXIT
from hpcvm.runtime.machine.timeouts import READY_TIMEOUT as READY_TIMEOUT
from hpcvm.runtime.net import network, vm_nics
from hpcvm.runtime.vm import readiness
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
        ready_timeout = readiness.ready_timeout(options, plan, media)
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
    readiness.wait_for_agent(started, backend, time.monotonic() + ready_timeout, ready_timeout)
    timeline.mark("up: agent answered")
    readiness.check_guest_nics(started)
    timeline.mark("up: guest NICs checked")
    return started


def _as_failure(exc: BaseException, machine: Machine, backend: Backend) -> BaseException:
    """The error to report for a failed start: QEMU's death beats its symptoms."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return exc
    if isinstance(exc, HpcvmError) and exc.cause == "qemu":
        return exc  # already QEMU's own account of what happened
    if backend.exit_code(machine) is not None:
        return RuntimeFailure(backend.death_message(machine))
    if isinstance(exc, HpcvmError):
        return exc
    return RuntimeFailure(f"starting VM {machine.name} failed: {type(exc).__name__}: {exc}")


def _interrupted(exc: BaseException) -> bool:
    return isinstance(exc, KeyboardInterrupt | SystemExit)
