"""Accelerator, guest CPU model and clock.

KVM only where an ordinary guest kernel can boot (VT-x/AMD-V present, not a paravirtual
KVM such as PVM); otherwise TCG, whose numbers say nothing about hardware
virtualization. The hpc profile gives the guest the host's CPU model with invariant TSC
and kvm-clock, which need KVM; under TCG it falls back to ``max`` and the TSC.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcvm.errors import InfeasiblePlanError
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import Accel, CpuModel, PlanRequest, Profile
from hpcvm.plan.notes import Notes

TCG_WARNING = (
    "TCG is software emulation: numbers measured in this VM say nothing about "
    "hardware virtualization (KVM) overhead"
)

# The clock string for a guest under TCG without the hpc profile: the kernel picks its
# own clocksource (tsc, hpet or acpi_pm), so nothing specific is planned.
GUEST_DEFAULT_CLOCK = "default"


@dataclass(frozen=True)
class CpuChoice:
    accel: Accel
    accel_reason: str
    cpu: CpuModel
    clock: str


def choose_cpu(
    host: HostTopology, request: PlanRequest, profile: Profile, notes: Notes
) -> CpuChoice:
    accel, reason = _choose_accel(host, request, notes)
    cpu, clock = _cpu_and_clock(accel, profile, notes)
    return CpuChoice(accel=accel, accel_reason=reason, cpu=cpu, clock=clock)


def _choose_accel(host: HostTopology, request: PlanRequest, notes: Notes) -> tuple[Accel, str]:
    kvm = host.kvm
    if request.accel == "tcg":
        notes.warn(TCG_WARNING, kind="tcg")
        reason = "TCG requested with --accel tcg"
        notes.decide("accel", f"accelerator TCG: {reason}; {TCG_WARNING}")
        return "tcg", reason
    if kvm.usable:
        reason = f"KVM is usable on this host: {kvm.reason}"
        notes.decide("accel", f"accelerator KVM: {reason}")
        return "kvm", reason
    if request.accel == "kvm":
        if _snapshot_may_have_vt(host):
            # A snapshot has no /dev to look at; its CPU flags show VT-x/AMD-V (or, in an
            # hwloc XML file, are not recorded at all), so the machine it describes can
            # run KVM when /dev/kvm is there: a plan for another machine may ask for it.
            cpu = (
                "the CPU has VT-x/AMD-V"
                if host.kvm.hw_virt
                else "it records no CPU flags to tell whether the CPU has VT-x/AMD-V"
            )
            reason = (
                "KVM requested; the host description cannot tell whether /dev/kvm exists, "
                f"and {cpu}"
            )
            notes.warn(
                "KVM assumed usable: the host description has no /dev/kvm information"
                + ("" if host.kvm.hw_virt else " and no CPU flags")
                + " (check that /dev/kvm exists and the CPU has VT-x/AMD-V on the real host)"
            )
            notes.decide("accel", f"accelerator KVM: {reason}")
            return "kvm", reason
        raise InfeasiblePlanError(
            f"--accel kvm but this host cannot run an ordinary KVM guest: {kvm.reason} "
            "(use --accel tcg or auto)",
            option="accel",
        )
    notes.warn(TCG_WARNING, kind="tcg")
    reason = f"{kvm.reason}; falling back to TCG. {TCG_WARNING}"
    notes.decide("accel", f"accelerator TCG (--accel auto): {reason}")
    return "tcg", reason


def _snapshot_may_have_vt(host: HostTopology) -> bool:
    return host.kvm.device is None and host.kvm.hw_virt is not False and not host.kvm.pvm


def _cpu_and_clock(accel: Accel, profile: Profile, notes: Notes) -> tuple[CpuModel, str]:
    if profile.host_cpu and accel == "kvm":
        notes.decide(
            "cpu",
            "CPU model host with +invtsc: the guest sees the host's CPU features, and an "
            "invariant TSC lets it trust the TSC across frequency changes",
        )
        notes.decide("clock", "clock kvm-clock: the paravirtual clock KVM provides")
        return CpuModel(model="host", features=("invtsc",)), "kvm-clock"
    if profile.host_cpu:
        notes.decide(
            "cpu",
            "CPU model max (not host): under TCG there is no host CPU to pass through; max "
            "is every feature TCG emulates. Invariant TSC needs KVM and is left out",
        )
        notes.decide(
            "clock",
            "clock tsc: kvm-clock needs KVM; under TCG the guest uses the emulated TSC",
        )
        return CpuModel(model="max"), "tsc"
    notes.decide(
        "cpu",
        f"CPU model: QEMU's default (qemu64), as the {profile.name} profile keeps QEMU's "
        "defaults for the CPU",
    )
    if accel == "kvm":
        notes.decide("clock", "clock kvm-clock: QEMU enables it by default under KVM")
        return CpuModel(model=None), "kvm-clock"
    notes.decide(
        "clock",
        "clock: the guest's own choice (tsc, hpet or acpi_pm): kvm-clock needs KVM",
    )
    return CpuModel(model=None), GUEST_DEFAULT_CLOCK
