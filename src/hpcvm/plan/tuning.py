"""Host and guest tuning that matches the pin set, given as recommendations.

hpcvm does not change a host's boot configuration: these are the lines a person applies
(and the reason for each), so the vCPU PUs get no timer ticks, RCU callbacks or device
interrupts, and the guest keeps its own housekeeping on vCPU 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcvm.host.model import HostTopology
from hpcvm.plan.model import Accel, ThpMode
from hpcvm.plan.notes import Notes
from hpcvm.plan.profiles import SMALL_PAGE, page_dir_name
from hpcvm.units import GIB, format_cpu_list

# The kernel's boot CPU: it keeps timekeeping and the interrupts that cannot move, so it
# is never isolated (isolcpus, nohz_full, rcu_nocbs), whatever runs on it; Linux itself
# drops it from nohz_full ("Clearing 0 from nohz_full range for timekeeping").
BOOT_CPU = 0


def isolatable(vcpu_pus: Sequence[int], housekeeping_pus: Sequence[int] = ()) -> list[int]:
    """The vCPU PUs that boot-time isolation may name: never CPU 0, never a
    housekeeping PU."""
    return [p for p in vcpu_pus if p != BOOT_CPU and p not in set(housekeeping_pus)]


def host_tuning(
    host: HostTopology,
    vcpu_pus: Sequence[int],
    housekeeping_pus: Sequence[int],
    page: int,
    hugepages_needed: dict[int, int],
    notes: Notes,
) -> tuple[str, ...]:
    cpus = format_cpu_list(list(vcpu_pus))
    isolated = format_cpu_list(isolatable(vcpu_pus, housekeeping_pus))
    house = format_cpu_list(list(housekeeping_pus))
    lines = [
        f"host kernel command line: isolcpus=managed_irq,domain,{isolated}"
        f"{_nohz_full(host, isolated, notes)} rcu_nocbs={isolated} irqaffinity={house}"
        + (
            ""
            if host.nohz_full is not None
            else "  # nohz_full needs a kernel with CONFIG_NO_HZ_FULL (not recorded here)"
        )
        if isolated
        else f"host kernel command line: irqaffinity={house}  # the only vCPU PU is CPU 0, "
        "which the kernel keeps (timekeeping): nothing to isolate",
        "systemctl disable --now irqbalance  # it would move device interrupts back onto "
        "the vCPU PUs",
        f"cpupower -c {cpus} frequency-set -g performance  # no frequency ramp on vCPU PUs",
    ]
    if host.thp == "always":
        lines.append(
            "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled  # THP 'always' "
            "lets khugepaged compact memory behind the vCPUs"
        )
    lines += _reservations(host, page, hugepages_needed)
    notes.decide(
        "tuning",
        f"host tuning recommended (not applied): keep ticks, RCU callbacks and interrupts "
        f"off the vCPU PUs {cpus}; interrupts go to the housekeeping PUs "
        f"{format_cpu_list(list(housekeeping_pus))}",
    )
    return tuple(lines)


def _nohz_full(host: HostTopology, cpus: str, notes: Notes) -> str:
    """`` nohz_full=CPUS`` unless the host's kernel is known to lack CONFIG_NO_HZ_FULL
    (it would ignore the argument, and `hpcvm tune --check` reports it absent)."""
    if host.nohz_full is False:
        notes.decide(
            "tuning",
            "nohz_full left out of the host command line: this host's kernel has no "
            "CONFIG_NO_HZ_FULL (no /sys/devices/system/cpu/nohz_full), so it would ignore "
            "it; a kernel built with it stops the scheduler tick on the vCPU PUs",
        )
        return ""
    return f" nohz_full={cpus}"


def _reservations(host: HostTopology, page: int, needed: dict[int, int]) -> list[str]:
    """Commands that leave enough free pages of the plan's size on each node."""
    if page == SMALL_PAGE:
        return []
    nodes = {n.os_index: n for n in host.nodes}
    lines = []
    for h, want in sorted(needed.items()):
        pool = nodes[h].pool(page)
        total = pool.total if pool else 0
        free = pool.free if pool and pool.free is not None else total
        target = max(total, total - free + want)
        path = f"/sys/devices/system/node/node{h}/hugepages/{page_dir_name(page)}/nr_hugepages"
        state = f"{free} of {total} free now" if pool and pool.free is not None else "free unknown"
        lines.append(
            f"echo {target} > {path}  # host node {h}: {want} pages for this guest ({state}); "
            "repeat at boot to keep them"
        )
    if page >= GIB and needed:
        lines.append(
            f"host kernel command line: hugepagesz=1G hugepages={sum(needed.values())}  "
            "# 1G pages are reliably reserved only at boot"
        )
    return lines


def guest_kernel_args(vcpus: int, accel: Accel, notes: Notes) -> tuple[str, ...]:
    """Guest command line: vCPU 0 does the guest's housekeeping, the rest compute."""
    args: list[str] = []
    if vcpus > 1:
        rest = format_cpu_list(list(range(1, vcpus)))
        args += [f"nohz_full={rest}", f"rcu_nocbs={rest}", "irqaffinity=0"]
    if accel == "kvm":
        args += ["clocksource=kvm-clock", "tsc=reliable"]
        why = "kvm-clock as clocksource and a TSC the guest need not watch (invariant TSC)"
    else:
        args += ["clocksource=tsc"]
        why = (
            "under TCG there is no kvm-clock and the emulated TSC is not invariant, so "
            "tsc=reliable is left out"
        )
    notes.decide(
        "tuning",
        "guest kernel command line recommended: "
        + (
            "vCPU 0 keeps the guest's ticks, RCU and interrupts, the others compute; "
            if vcpus > 1
            else "one vCPU: no CPU to isolate; "
        )
        + why,
    )
    return tuple(args)


def guest_thp_args(mode: ThpMode | None, notes: Notes) -> tuple[str, ...]:
    """The guest's transparent huge page mode, when one was asked for: the guest kernel
    takes it from its command line (the built-in guest's; a disk image keeps its own
    boot loader's, and verification then finds the mode it really has)."""
    if mode is None:
        return ()
    notes.decide(
        "tuning",
        f"guest transparent huge pages {mode}: transparent_hugepage={mode} on the guest "
        "kernel command line (the guest's own page size over its memory, whatever the "
        "host's pages under it)",
    )
    return (f"transparent_hugepage={mode}",)
