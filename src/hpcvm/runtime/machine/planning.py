"""Planning a VM for this host beside the user's live VMs: for ``up``, a restore and a
migration's receiving side.

Why a module of its own: a plan made here must keep off the PUs the live VMs hold (read
from their records, runtime/machine/taken.py), with ``--accel auto`` boot on KVM only
where a probe guest does (runtime/hostside/accel.py), and stay true until the new VM's
record is written (``placement_lock``). Why in machine/: it reads the records and starts
nothing; the VM's start is runtime/vm/lifecycle.py's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator, Sequence

from hpcvm.errors import InfeasiblePlanError
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import PlanRequest, TakenPus, VMPlan
from hpcvm.runtime.hostside import accel, paths
from hpcvm.units import format_cpu_list

Warn = Callable[[str], None]


def make_plan(
    request: PlanRequest,
    *,
    host: HostTopology | None = None,
    kernel: str | None = None,
    warn: Warn | None = None,
    taken: Sequence[TakenPus] | None = None,
) -> VMPlan:
    """Plan ``request`` for this host (discovered live unless given), beside the
    user's live VMs: their PUs (``taken``, read from their records unless given) are
    kept off the new vCPUs while other PUs are free, and the plan warns when it must
    share them (plan/taken.py).

    With ``--accel auto`` on a host whose KVM looks usable, a probe guest must also boot
    on it (accel.probe_kvm); otherwise the plan is redone for TCG with a warning.
    """
    from hpcvm.host import discover
    from hpcvm.plan import plan as planned
    from hpcvm.runtime.machine.taken import live_taken

    host = host if host is not None else discover()
    held = live_taken() if taken is None else tuple(taken)

    def make(host: HostTopology, request: PlanRequest) -> VMPlan:
        return planned(host, request, held)

    try:
        result = make(host, request)
    except InfeasiblePlanError as exc:
        hinted = _with_housekeeping_hint(exc, request)
        if hinted is exc:
            raise
        raise hinted from exc
    if result.accel == "kvm" and request.accel == "auto" and kernel is not None:
        probe = accel.probe_kvm(kernel)
        if not probe.ok:
            if warn:
                warn(f"KVM probe failed ({probe.detail}); falling back to TCG")
            result = make(host, request.model_copy(update={"accel": "tcg"}))
    return result


def plan_same_guest(
    request: PlanRequest,
    differences: Callable[[VMPlan], list[str]],
    *,
    host: HostTopology | None = None,
    warn: Warn | None = None,
    taken: Sequence[TakenPus] | None = None,
) -> tuple[VMPlan, list[str]]:
    """Re-plan the host side of a guest that exists already (a restore, a migration's
    receiving side): beside the live VMs (``taken``, read from their records unless
    given) where that keeps the guest the same, else on the PUs the guest's own layout
    needs, shared or not (the running guest cannot change its topology). Returns the
    plan and its ``differences`` from the guest."""
    from hpcvm.runtime.machine.taken import live_taken

    held = live_taken() if taken is None else tuple(taken)
    plan = make_plan(request, host=host, warn=warn, taken=held)
    found = differences(plan)
    if not found or not held:
        return plan, found
    alone = make_plan(request, host=host, warn=warn, taken=())
    if differences(alone):
        return plan, found
    shared = {pu for vm in held for pu in (*vm.vcpu_pus, *vm.qemu_pus)} & set(alone.vcpu_pus())
    if shared and warn is not None:
        warn(
            f"VM {request.name} keeps its guest layout on PUs {format_cpu_list(shared)}, "
            "which your running VMs hold too: off them it would not be the same guest"
        )
    return alone, []


def _with_housekeeping_hint(exc: InfeasiblePlanError, request: PlanRequest) -> Exception:
    """On a small host the housekeeping core is what leaves too few PUs for the vCPUs:
    say that ``--housekeeping 0`` is the other way out, if the planner did not."""
    if exc.cause != "housekeeping" or request.housekeeping == 0:
        return exc
    return InfeasiblePlanError(
        f"{exc.message}; or keep {request.vcpus} vCPUs with --housekeeping 0 (QEMU's own "
        "threads then share the vCPUs' cores)",
        cause=exc.cause,
        option=exc.option,
    )


@contextlib.contextmanager
def placement_lock() -> Iterator[None]:
    """One ``up`` at a time from reading the live VMs' PUs to writing its own record
    (which the next one reads: runtime/machine/taken.py), so two ``up`` started together do not
    both take the same free PU. An flock on the runtime directory itself: no file is
    left, and the kernel drops it with the process."""
    fd = os.open(paths.ensure_root(), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
