"""The PUs the user's running VMs hold: a new VM's vCPUs keep off them while others
are free, and the plan says so when they cannot.

Two VMs pinned to one PU each get half of it, and another VM's QEMU threads on a vCPU's
PU are noise, so a pinned plan takes the first of these views of the host that holds
its vCPUs (and their memory):

1. cores none of whose PUs another VM holds (no SMT sibling shared either);
2. PUs no other VM holds, the cores with the fewest held siblings first;
3. the PUs held by at most one VM, then by at most two, ...: the plan then warns which
   PUs it shares with which VM.

Pure: the held PUs come in as data (``TakenPus``, read from the live VMs' records by
runtime/machine/taken.py); housekeeping cores are not moved (an hpc plan keeps the lowest cores
of each node for QEMU's threads, as documented), but the plan says when they are
another VM's vCPU PUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hpcvm.plan.model import TakenPus
from hpcvm.plan.notes import Notes
from hpcvm.plan.placement import CpuLayout, Selection
from hpcvm.units import format_cpu_list


@dataclass(frozen=True)
class Busy:
    """Who holds which PU: PU -> the running VMs (names) whose vCPUs or QEMU threads
    are pinned there; ``vcpu_of``: PU -> the VMs whose vCPUs run there."""

    owners: dict[int, tuple[str, ...]]
    vcpu_of: dict[int, tuple[str, ...]]

    def load(self, pu: int) -> int:
        return len(self.owners.get(pu, ()))


NOBODY = Busy({}, {})


def busy_pus(taken: Iterable[TakenPus]) -> Busy:
    """Index the running VMs' PUs by PU (a VM counted once per PU)."""
    owners: dict[int, list[str]] = {}
    vcpu_of: dict[int, list[str]] = {}
    for vm in taken:
        for pu in dict.fromkeys((*vm.vcpu_pus, *vm.qemu_pus)):
            owners.setdefault(pu, []).append(vm.vm)
        for pu in dict.fromkeys(vm.vcpu_pus):
            vcpu_of.setdefault(pu, []).append(vm.vm)
    return Busy({p: tuple(v) for p, v in owners.items()}, {p: tuple(v) for p, v in vcpu_of.items()})


def layouts(layout: CpuLayout, busy: Busy) -> list[CpuLayout]:
    """The views of ``layout`` to try in order (module doc): the cores no running VM
    holds a PU of, then the PUs held by at most 0, 1, 2, ... VMs (so no PU is shared by
    more VMs than it must be), the cores with the fewest held PUs first; just
    ``layout`` when no running VM holds a usable PU."""
    usable = {pu for cores in layout.vcpu_cores.values() for c in cores for pu in c}
    loads = {busy.load(pu) for pu in usable}
    if loads == {0}:
        return [layout]

    def core_load(core: tuple[int, ...]) -> int:
        return sum(busy.load(pu) for pu in core)

    def upto(most: int) -> dict[int, tuple[tuple[int, ...], ...]]:
        out = {}
        for n, cores in layout.vcpu_cores.items():
            kept = (
                tuple(p for p in sorted(c, key=busy.load) if busy.load(p) <= most) for c in cores
            )
            ranked = sorted(zip(cores, kept, strict=True), key=lambda ck: core_load(ck[0]))
            out[n] = tuple(k for _, k in ranked if k)  # stable: lowest-numbered on ties
        return out

    whole = {
        n: tuple(c for c in cores if not core_load(c)) for n, cores in layout.vcpu_cores.items()
    }
    views: list[CpuLayout] = []
    for cores in (whole, *(upto(most) for most in range(max(loads) + 1))):
        if all(cores != v.vcpu_cores for v in views):
            views.append(replace(layout, vcpu_cores=cores))
    return views


def describe_sharing(selection: Selection, layout: CpuLayout, busy: Busy, notes: Notes) -> None:
    """Say which held PUs the plan kept free, and warn for each it could not (a vCPU on
    another VM's PU or SMT sibling; QEMU's housekeeping on another VM's vCPU PU)."""
    held = {pu: vms for pu, vms in busy.owners.items() if pu in _usable(layout)}
    if not held:
        return
    vcpu_pus = [pu for n in selection.nodes for pu in selection.pus[n]]
    core_of = {pu: c for cores in layout.node_cores.values() for c in cores for pu in c}
    shared = [pu for pu in vcpu_pus if pu in held]
    siblings = {
        pu: [s for s in core_of[pu] if s != pu and s in held] for pu in vcpu_pus if pu not in held
    }
    siblings = {pu: s for pu, s in siblings.items() if s}
    if shared:
        free = len(_usable(layout) - set(held))
        fewer = f", or give this VM {free} vCPU(s) or fewer" if free else ""
        notes.warn(
            f"vCPU PUs shared with your running VMs: {_owned(shared, busy)} ({free} usable "
            f"PU(s) free of them): the VMs take turns on the shared PUs; stop one with "
            f"`hpcvm down NAME`{fewer}"
        )
    for pu, others in siblings.items():
        notes.warn(
            f"vCPU PU {pu} is an SMT sibling of PU(s) held by your running VMs "
            f"({_owned(others, busy)}): they share the core's execution units"
        )
    if not shared and not siblings:
        notes.decide(
            "vcpus",
            f"held PUs {format_cpu_list(list(held))} kept free of this VM's vCPUs: your "
            f"running VMs hold them ({_owned(sorted(held), busy)})",
        )
    hk_shared = [pu for pu in selection.housekeeping_pus if pu in busy.vcpu_of]
    if hk_shared:
        notes.warn(
            "QEMU's housekeeping PUs are vCPU PUs of your running VMs: "
            f"{_owned(hk_shared, busy)}; this VM's emulator and I/O threads add noise there"
        )


def _usable(layout: CpuLayout) -> set[int]:
    return {pu for cores in layout.node_cores.values() for c in cores for pu in c}


def _owned(pus: Sequence[int], busy: Busy) -> str:
    """'PU 0 with VM a, PU 1 with VMs b, c'."""
    return ", ".join(
        f"PU {pu} with VM{'s' if len(busy.owners[pu]) > 1 else ''} " + ", ".join(busy.owners[pu])
        for pu in sorted(pus)
    )
