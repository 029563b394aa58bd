"""A VM's NICs in its plan and on its boot spec, once runtime/net/network.py has resolved
them: a VF NIC joins the plan as a passthrough device, and every NIC goes on the boot
spec with, for a guest that reads hpcvm's command line, the word that configures it.

Why a module of its own: what the NICs change in the plan and in the guest's command
line is the same for ``up``, a restore and a migration's receiving side, and needs
nothing of the VM's start (runtime/vm/lifecycle.py) nor of the network kinds' own work.
"""

from __future__ import annotations

from hpcvm.bootspec import BootSpec, Nic, nic_kernel_arg
from hpcvm.errors import UsageError
from hpcvm.plan.model import PlanRequest, VMPlan
from hpcvm.runtime.net import network
from hpcvm.runtime.net.base import Warn

DISK_ADDRESS_WARNING = "a disk image configures its own network: --address is not set in the guest"


def with_vfs(request: PlanRequest, nics: tuple[Nic, ...]) -> PlanRequest:
    """A VF NIC is a passthrough device: the planner checks its IOMMU group and NUMA
    node like any other (plan/passthrough.py)."""
    from hpcvm.plan.passthrough import normalise_bdf

    asked = {normalise_bdf(bdf) for bdf in request.passthrough}
    vfs = [bdf for bdf in network.passthrough_of(nics) if bdf not in asked]
    if not vfs:
        return request
    return request.model_copy(update={"passthrough": (*request.passthrough, *vfs)})


def plan_has_vfs(plan: VMPlan, nics: tuple[Nic, ...]) -> VMPlan:
    """A ready plan must pass through every VF NIC already: it is not re-planned."""
    passed = {dev.bdf for dev in plan.passthrough}
    missing = [bdf for bdf in network.passthrough_of(nics) if bdf not in passed]
    if missing:
        raise UsageError(
            f"the plan does not pass through the VF {', '.join(missing)} that --network "
            "names: plan it with --passthrough too"
        )
    return plan


def on_boot(boot: BootSpec, nics: tuple[Nic, ...], warn: Warn | None) -> BootSpec:
    """The NICs on the boot spec and, for a guest that reads hpcvm's command line (the
    built-in one, a user's kernel), one ``hpcvm.net=`` word each: the guest configures
    them itself, no DHCP server needed. A disk image boots its own command line, so its
    own network configuration applies; say so when an address was asked for."""
    if not nics:
        return boot
    boot = boot.model_copy(update={"nics": nics})
    if boot.cmdline is not None and boot.share_table:
        words = " ".join(nic_kernel_arg(nic) for nic in nics)
        boot = boot.model_copy(update={"cmdline": f"{boot.cmdline} {words}"})
    elif warn is not None and any(nic.address for nic in nics):
        warn(DISK_ADDRESS_WARNING)
    return boot
