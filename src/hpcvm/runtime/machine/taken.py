"""The PUs this user's live VMs hold, read from their records, for the planner.

``up`` (and a restore, a migration's receiving side, ``hpcvm plan`` on this host) plans
a new VM beside the VMs already running: the planner keeps the new vCPUs off their PUs
while others are free (plan/taken.py). Only VMs whose QEMU is alive count, and those
another ``up`` is starting right now (their record holds the plan they will run with);
a stale record holds nothing, and neither does the record of a VM on another host (a
runtime directory on a file system several hosts share: the test cluster's nodes).
"""

from __future__ import annotations

import socket

from hpcvm.plan.model import TakenPus, VMPlan
from hpcvm.runtime.machine import state


def held_pus(plan: VMPlan, name: str) -> TakenPus:
    """What one VM's plan pins: its vCPUs' PUs and its QEMU threads' PUs."""
    return TakenPus(
        vm=name,
        vcpu_pus=plan.vcpu_pus(),
        qemu_pus=tuple(dict.fromkeys((*plan.emulator_pus, *plan.iothread_pus))),
    )


def live_taken(*, besides: str | None = None) -> tuple[TakenPus, ...]:
    """The PUs of every live VM of this user (running, or being started with its
    record written), but ``besides`` (the VM being planned, when it is re-planned);
    VMs that pin nothing are left out."""
    out: list[TakenPus] = []
    here = socket.gethostname()
    for entry in state.list_entries():
        machine = entry.machine
        if machine is None or entry.state == "stale" or entry.name == besides:
            continue
        if machine.host not in ("", here):
            continue
        held = held_pus(machine.plan, entry.name)
        if held.vcpu_pus or held.qemu_pus:
            out.append(held)
    return tuple(out)
