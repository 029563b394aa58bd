"""VM environments: plan the VM of a profile, boot it once (left paused), and run each
argv in the guest (see environments.py); what runs in the guest, and how a sample is
taken there, is bench/guest_sampler.py's.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from hpcvm.bench.environments import VM_PREFIX, RunOutput
from hpcvm.bench.guest_sampler import GuestSampler
from hpcvm.bench.versions import host_versions
from hpcvm.errors import HpcvmError, InfeasiblePlanError, RuntimeFailure
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import PlanRequest, ProfileName, VMPlan
from hpcvm.store.records import EnvKind, NewEnvironment

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from hpcvm.runtime.model import Machine


def plan_vm(
    profile: ProfileName,
    *,
    vcpus: int,
    memory_bytes: int,
    guest_nodes: int | None = None,
    host: HostTopology | None = None,
) -> tuple[VMPlan, list[str]]:
    """The plan of environment ``vm:<profile>`` on this host, and warnings for the run.

    On a host too small for the hpc profile's housekeeping core plus ``vcpus`` vCPUs,
    retry with no housekeeping core and say so in a warning (the VM is then the hpc
    profile minus the isolation of QEMU's threads); if the planner refuses that too,
    its original refusal stands.
    """
    from hpcvm.host import discover
    from hpcvm.plan import plan as make_plan

    host = host if host is not None else discover()
    request = PlanRequest(
        name=f"bench-{profile}",
        profile=profile,
        vcpus=vcpus,
        memory_bytes=memory_bytes,
        guest_nodes=guest_nodes if profile in ("numa", "hpc") else None,
    )
    warnings: list[str] = []
    try:
        plan = make_plan(host, request)
    except InfeasiblePlanError as exc:
        if profile != "hpc" or exc.cause != "housekeeping":
            raise _in_bench_terms(profile, exc) from exc
        try:
            plan = make_plan(host, request.model_copy(update={"housekeeping": 0}))
        except HpcvmError as again:
            raise InfeasiblePlanError(
                f"vm:hpc with {vcpus} vCPUs does not fit this host: {exc.message} "
                f"(and housekeeping 0 is refused too: {again.message}); give vm:hpc fewer "
                "vCPUs (--vm-vcpus, --np) or use vm:numa",
                cause=exc.cause,
                option="vcpus",
            ) from exc
        warnings.append(
            f"vm:hpc: this host has too few PUs for {vcpus} vCPUs plus a housekeeping core; "
            "planned with housekeeping 0 (QEMU's own threads share the vCPUs' cores), so "
            "vm:hpc here lacks the hpc profile's thread isolation"
        )
    except HpcvmError as exc:
        raise _in_bench_terms(profile, exc) from exc
    warnings += [
        f"{VM_PREFIX}{profile}: {w}"
        for w, kind in itertools.zip_longest(
            plan.warnings, plan.warning_kinds[: len(plan.warnings)], fillvalue="plan"
        )
        if kind != "tcg"  # the run says that once, from the environments' accelerators
    ]
    return plan, warnings


# The planner's request field -> what sets it in ``hpcvm bench``, as a phrase after
# "in hpcvm bench". A field bench leaves at the profile's default has no entry.
_BENCH_OPTION: dict[str, str] = {
    "vcpus": "the VM's --vcpus is --vm-vcpus or the largest --np",
    "memory_bytes": "the VM's --memory is --vm-memory",
    "guest_nodes": "the VM's --guest-nodes is --vm-guest-nodes",
    "profile": "--profile P is --env vm:P",
}
# The request field -> the flag the planner's messages call it.
_PLAN_FLAG: dict[str, str] = {
    "page_size_bytes": "--page-size",
    "housekeeping": "--housekeeping",
    "passthrough": "--passthrough",
    "accel": "--accel",
    "smt": "--smt",
}


def _in_bench_terms(profile: str, exc: HpcvmError) -> HpcvmError:
    """The planner's refusal, said for ``hpcvm bench``: the request field it is about
    (``exc.option``, data) names the bench option that sets it, or says that bench
    plans that field with the profile's default. A refusal about no request field (the
    host itself) needs no translation."""
    message = f"{VM_PREFIX}{profile}: {exc.message}"
    if exc.option in _BENCH_OPTION:
        message += f" (in hpcvm bench {_BENCH_OPTION[exc.option]})"
    elif exc.option is not None:
        flag = _PLAN_FLAG.get(exc.option, exc.option)
        message += (
            f" (hpcvm bench has no {flag}: it plans {VM_PREFIX}{profile} with the "
            "profile's default)"
        )
    return type(exc)(message, cause=exc.cause, option=exc.option)


def describe_vm(
    name: str, plan: VMPlan, machine: Machine | None, facts: Sequence[str], *, vcpus: int
) -> NewEnvironment:
    """A VM environment as the store records it: its plan, accelerator, the guest's
    kernel, CPU model and clocksource (its facts), the backend and image."""
    kernel, cpu, clocksource = [*facts, "", "", ""][:3]
    versions = {**host_versions(), "guest_kernel": kernel}
    if machine is not None:
        versions["backend"] = machine.backend
        versions["guest_image"] = machine.image
    if clocksource:
        versions["guest_clocksource"] = clocksource
    return NewEnvironment(
        name=name,
        kind="vm",
        profile=plan.profile,
        plan=plan.model_dump(mode="json"),
        accel=plan.accel,
        cpu_model=cpu or (plan.cpu.model or "qemu64"),
        versions=versions,
        vcpus=vcpus,
        memory_bytes=plan.memory_bytes,
    )


class VmEnvironment:
    """A VM of one profile, booted once per run and paused while others are measured."""

    kind: EnvKind = "vm"
    pauses = True  # paused while other environments are measured

    def __init__(
        self,
        plan: VMPlan,
        *,
        vm_name: str,
        backend: str = "qemu",
        shares: tuple[str, ...] = (),
    ) -> None:
        """``shares``: host directories the suites run from besides the working
        directory (an NPB bin directory, a --cmd program's), shared read-only."""
        self.plan = plan
        self.shares = shares
        self.profile: ProfileName = plan.profile
        self.name = f"{VM_PREFIX}{plan.profile}"
        self.vcpus = plan.vcpus
        self.memory_bytes = plan.memory_bytes
        self.vm_name = vm_name
        self.backend_name: str = backend
        self.sampler: GuestSampler | None = None

    @property
    def machine(self) -> Machine | None:
        return self.sampler.machine if self.sampler is not None else None

    def start(self) -> None:
        from hpcvm.runtime import lifecycle
        from hpcvm.runtime.options import UpOptions

        machine = lifecycle.up(
            self.plan, UpOptions(name=self.vm_name, backend=self.backend_name, shares=self.shares)
        )
        self.sampler = GuestSampler(machine, self.name)
        try:
            self.sampler.learn()
        except BaseException:
            self.close()
            raise
        self.deactivate()

    def activate(self) -> None:
        from hpcvm.runtime.backends import get_backend

        if (machine := self.machine) is not None:
            get_backend(machine.backend, machine.connect_uri).resume(machine)

    def deactivate(self) -> None:
        from hpcvm.runtime.backends import get_backend

        if (machine := self.machine) is not None:
            get_backend(machine.backend, machine.connect_uri).pause(machine)

    def close(self) -> None:
        from hpcvm.runtime import stopping

        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.close()
            stopping.teardown(sampler.machine)

    def describe(self) -> NewEnvironment:
        facts = self.sampler.facts if self.sampler is not None else ()
        return describe_vm(self.name, self.plan, self.machine, facts, vcpus=self.vcpus)

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        if self.sampler is None:
            raise RuntimeFailure(f"{self.name}: the VM is not running")
        return self.sampler.run(argv, workdir, timeout, outputs=outputs)
