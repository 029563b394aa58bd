"""VM environments: plan the VM of a profile, boot it once (left paused), and run each
argv in the guest (see environments.py); what runs in the guest, and how a sample is
taken there, is bench/envs/guest_sampler.py's.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from hpcvm.bench.envs.environments import VM_PREFIX, RunOutput
from hpcvm.bench.envs.guest_sampler import GuestSampler
from hpcvm.bench.envs.variants import BASE, EnvChoice, VmVariant
from hpcvm.bench.envs.versions import host_versions
from hpcvm.errors import HpcvmError, InfeasiblePlanError, RuntimeFailure, VerificationFailed
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import PlanRequest, ProfileName, ThpMode, VMPlan
from hpcvm.plan.names import THP_MODES
from hpcvm.store.records import EnvKind, NewEnvironment

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from hpcvm.runtime.machine.model import Machine


def plan_vm(
    profile: ProfileName,
    *,
    vcpus: int,
    memory_bytes: int,
    guest_nodes: int | None = None,
    host: HostTopology | None = None,
    variant: VmVariant = BASE,
) -> tuple[VMPlan, list[str]]:
    """The plan of environment ``vm:<profile>`` (with ``variant``'s page size and guest
    THP mode: bench/envs/variants.py) on this host, and warnings for the run.

    On a host too small for the hpc profile's housekeeping core plus ``vcpus`` vCPUs,
    retry with no housekeeping core and say so in a warning (the VM is then the hpc
    profile minus the isolation of QEMU's threads); if the planner refuses that too,
    its original refusal stands.
    """
    from hpcvm.host import discover
    from hpcvm.plan import plan as make_plan

    host = host if host is not None else discover()
    env = EnvChoice(kind="vm", profile=profile, variant=variant).name
    request = PlanRequest(
        name=f"bench-{profile}",
        profile=profile,
        vcpus=vcpus,
        memory_bytes=memory_bytes,
        guest_nodes=guest_nodes if profile in ("numa", "hpc") else None,
        page_size_bytes=variant.page,
        guest_thp=_thp(variant.thp),
    )
    warnings: list[str] = []
    try:
        plan = make_plan(host, request)
    except InfeasiblePlanError as exc:
        if profile != "hpc" or exc.cause != "housekeeping":
            raise _in_bench_terms(env, exc) from exc
        try:
            plan = make_plan(host, request.model_copy(update={"housekeeping": 0}))
        except HpcvmError as again:
            raise InfeasiblePlanError(
                f"{env} with {vcpus} vCPUs does not fit this host: {exc.message} "
                f"(and housekeeping 0 is refused too: {again.message}); give {env} fewer "
                "vCPUs (--vm-vcpus, --np) or use vm:numa",
                cause=exc.cause,
                option="vcpus",
            ) from exc
        warnings.append(
            f"{env}: this host has too few PUs for {vcpus} vCPUs plus a housekeeping core; "
            "planned with housekeeping 0 (QEMU's own threads share the vCPUs' cores), so "
            f"{env} here lacks the hpc profile's thread isolation"
        )
    except HpcvmError as exc:
        raise _in_bench_terms(env, exc) from exc
    warnings += [
        f"{env}: {w}"
        for w, kind in itertools.zip_longest(
            plan.warnings, plan.warning_kinds[: len(plan.warnings)], fillvalue="plan"
        )
        if kind != "tcg"  # the run says that once, from the environments' accelerators
    ]
    return plan, warnings


def _thp(mode: str | None) -> ThpMode | None:
    return next((m for m in THP_MODES if m == mode), None)


# The planner's request field -> what sets it in ``hpcvm bench``, as a phrase after
# "in hpcvm bench". A field bench leaves at the profile's default has no entry.
_BENCH_OPTION: dict[str, str] = {
    "vcpus": "the VM's --vcpus is --vm-vcpus or the largest --np",
    "memory_bytes": "the VM's --memory is --vm-memory",
    "guest_nodes": "the VM's --guest-nodes is --vm-guest-nodes",
    "profile": "--profile P is --env vm:P",
    "page_size_bytes": "the VM's --page-size is the environment's +page=4K|2M|1G, e.g. "
    "--env vm:hpc+page=4K",
    "guest_thp": "the guest's THP mode is the environment's +thp=always|madvise|never",
}
# The request field -> the flag the planner's messages call it.
_PLAN_FLAG: dict[str, str] = {
    "housekeeping": "--housekeeping",
    "passthrough": "--passthrough",
    "accel": "--accel",
    "smt": "--smt",
}


def _in_bench_terms(env: str, exc: HpcvmError) -> HpcvmError:
    """The planner's refusal, said for ``hpcvm bench`` about environment ``env``: the
    request field it is about (``exc.option``, data) names the bench option that sets
    it, or says that bench plans that field with the profile's default. A refusal about
    no request field (the host itself) needs no translation."""
    message = f"{env}: {exc.message}"
    if exc.option in _BENCH_OPTION:
        message += f" (in hpcvm bench {_BENCH_OPTION[exc.option]})"
    elif exc.option is not None:
        flag = _PLAN_FLAG.get(exc.option, exc.option)
        message += f" (hpcvm bench has no {flag}: it plans {env} with the profile's default)"
    return type(exc)(message, cause=exc.cause, option=exc.option)


def verify_variant(name: str, sampler: GuestSampler, variant: VmVariant) -> dict[str, str]:
    """Check in the running VM that it is what its environment claims (the NIC model,
    the host page size under guest RAM, the guest's THP mode: runtime/verify/variant.py)
    and return what was observed; VerificationFailed (exit 6) naming what differs, so no
    sample is ever taken in a VM that is not the environment it is recorded as."""
    from hpcvm.runtime.backends.registry import get_backend
    from hpcvm.runtime.verify import variant as pages

    machine = sampler.machine
    backend = get_backend(machine.backend, machine.connect_uri)
    seen = pages.gather(machine, sampler, backend)
    checks = pages.run_checks(machine.plan, machine.boot.nics, variant.thp, seen)
    wrong = [c for c in checks if not c.ok]
    if wrong:
        said = "; ".join(
            f"{c.name}: expected {c.expected}, found {c.actual}"
            + (f" ({c.detail})" if c.detail else "")
            for c in wrong
        )
        raise VerificationFailed(
            f"{name} is not what it claims after boot ({said}); it was taken down before "
            "any sample, which would have been recorded under its name"
        )
    return pages.facts(machine.plan, seen)


def with_variant(
    described: NewEnvironment, variant: VmVariant, observed: dict[str, str]
) -> NewEnvironment:
    """The record of an environment with its variant (as data) and what was observed of
    the variables variants change, in its versions."""
    return described.model_copy(
        update={
            "variant": variant.record(),
            "versions": {**described.versions, **observed},
        }
    )


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
        name: str | None = None,
        variant: VmVariant = BASE,
    ) -> None:
        """``shares``: host directories the suites run from besides the working
        directory (an NPB bin directory, a --cmd program's), shared read-only.
        ``name``: the environment's (``vm:<profile>`` by default); ``variant``: what it
        changes of its profile, checked in the running VM after boot."""
        self.plan = plan
        self.shares = shares
        self.profile: ProfileName = plan.profile
        self.name = name or f"{VM_PREFIX}{plan.profile}"
        self.variant = variant
        self.vcpus = plan.vcpus
        self.memory_bytes = plan.memory_bytes
        self.vm_name = vm_name
        self.backend_name: str = backend
        self.sampler: GuestSampler | None = None
        self.observed: dict[str, str] = {}  # the variant's variables, seen after boot

    @property
    def machine(self) -> Machine | None:
        return self.sampler.machine if self.sampler is not None else None

    def start(self) -> None:
        """Boot the VM as this process's (runtime/machine/state.py ``owned_by_this_process``):
        a bench killed outright leaves it "orphaned" in ``hpcvm ps``, for ``hpcvm down
        --orphans`` (or the run's ``--resume``) to take down."""
        from hpcvm.runtime.machine import state
        from hpcvm.runtime.machine.options import UpOptions
        from hpcvm.runtime.vm import lifecycle

        options = UpOptions(name=self.vm_name, backend=self.backend_name, shares=self.shares)
        with state.owned_by_this_process("hpcvm bench"):
            machine = lifecycle.up(self.plan, options)
        self.sampler = GuestSampler(machine, self.name)
        try:
            self.sampler.learn()
            self.observed = verify_variant(self.name, self.sampler, self.variant)
        except BaseException:
            self.close()
            raise
        self.deactivate()

    def activate(self) -> None:
        from hpcvm.runtime.backends.registry import get_backend

        if (machine := self.machine) is not None:
            get_backend(machine.backend, machine.connect_uri).resume(machine)

    def deactivate(self) -> None:
        from hpcvm.runtime.backends.registry import get_backend

        if (machine := self.machine) is not None:
            get_backend(machine.backend, machine.connect_uri).pause(machine)

    def close(self) -> None:
        from hpcvm.runtime.vm import stopping

        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.close()
            stopping.teardown(sampler.machine)

    def describe(self) -> NewEnvironment:
        facts = self.sampler.facts if self.sampler is not None else ()
        described = describe_vm(self.name, self.plan, self.machine, facts, vcpus=self.vcpus)
        return with_variant(described, self.variant, self.observed)

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        if self.sampler is None:
            raise RuntimeFailure(f"{self.name}: the VM is not running")
        return self.sampler.run(argv, workdir, timeout, outputs=outputs)
