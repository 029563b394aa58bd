"""Where the PUs to quiet come from: a running VM's plan, a plan file, or two lists.

Reads the host's online CPUs and the VM records; the choice itself (``from_plan``,
``validated``) is pure, so it is tested on plans without touching the host.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError

from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.model import first_complaint
from hpcvm.plan.model import VMPlan
from hpcvm.plan.profiles import SMALL_PAGE
from hpcvm.tune import cpumask, files
from hpcvm.tune.model import TuneTarget
from hpcvm.units import format_cpu_list

ONLINE = Path("/sys/devices/system/cpu/online")


def online_pus() -> frozenset[int]:
    """The host's online CPUs (PUs)."""
    return cpumask.parse_list(files.read(ONLINE) or "")


def validated(
    vcpu_pus: tuple[int, ...],
    housekeeping_pus: tuple[int, ...] | None,
    online: frozenset[int],
    *,
    hugetlbfs: bool,
    source: str,
) -> TuneTarget:
    """The target, or a one-line error: vCPU PUs online, housekeeping PUs online, the
    two disjoint and at least one housekeeping PU left (default: every other online PU).
    """
    vcpus = frozenset(vcpu_pus)
    if not vcpus:
        raise UsageError(f"{source}: no vCPU PUs to tune for (the VM is not pinned?)")
    offline = vcpus - online
    if offline:
        raise UsageError(
            f"{source}: vCPU PUs {format_cpu_list(offline)} are not online here "
            f"(online: {format_cpu_list(online)})"
        )
    house = online - vcpus if housekeeping_pus is None else frozenset(housekeeping_pus)
    if house & vcpus:
        raise UsageError(
            f"{source}: PUs {format_cpu_list(house & vcpus)} are both vCPU and housekeeping "
            "PUs: a housekeeping PU is never isolated"
        )
    if house - online:
        raise UsageError(
            f"{source}: housekeeping PUs {format_cpu_list(house - online)} are not online here"
        )
    if not house:
        raise InfeasiblePlanError(
            f"{source}: no housekeeping PU is left (vCPU PUs {format_cpu_list(vcpus)} are all "
            "online PUs): give the VM fewer vCPUs so the host keeps a PU for itself"
        )
    return TuneTarget(
        vcpu_pus=tuple(sorted(vcpus)),
        housekeeping_pus=tuple(sorted(house)),
        hugetlbfs=hugetlbfs,
        source=source,
    )


def from_plan(plan: VMPlan, online: frozenset[int], source: str) -> TuneTarget:
    """The plan's vCPU PUs; its housekeeping PUs when it has them (hpc), else every
    other online PU."""
    if not plan.pinned:
        raise UsageError(
            f"{source}: profile {plan.profile!r} does not pin vCPUs, so there are no PUs to "
            "quiet: use the pinned, hugepages, numa or hpc profile"
        )
    return validated(
        plan.vcpu_pus(),
        plan.housekeeping_pus or None,
        online,
        hugetlbfs=plan.page_size_bytes != SMALL_PAGE,
        source=source,
    )


def from_plan_file(path: Path) -> TuneTarget:
    """A plan as `hpcvm plan --format json` prints it."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read plan {path}: {exc.strerror}") from exc
    try:
        plan = VMPlan.model_validate_json(text)
    except ValidationError as exc:
        raise UsageError(
            f"{path} is not a plan ({first_complaint(exc).line()}): write one with "
            "`hpcvm plan ... --format json`"
        ) from None
    return from_plan(plan, online_pus(), f"plan {path}")


def from_vm(name: str) -> TuneTarget:
    """The plan of a VM hpcvm started (its machine record)."""
    from hpcvm.runtime.machine.state import load_machine

    return from_plan(load_machine(name).plan, online_pus(), f"VM {name}")


# The kernel's list form as a person types it: numbers and low-high ranges, commas.
_CPU_LIST_RE = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


def from_lists(vcpu_pus: str, housekeeping_pus: str | None) -> TuneTarget:
    """--vcpu-pus / --housekeeping-pus as typed."""
    vcpus = _typed_list("--vcpu-pus", vcpu_pus)
    house = (
        None if housekeeping_pus is None else _typed_list("--housekeeping-pus", housekeeping_pus)
    )
    return validated(vcpus, house, online_pus(), hugetlbfs=False, source="--vcpu-pus")


def _typed_list(option: str, text: str) -> tuple[int, ...]:
    """One option's CPU list; a one-line error naming that option and its text alone
    (a range running down, like 5-2, is a typo, not an empty set)."""
    ok = _CPU_LIST_RE.fullmatch(text.strip()) is not None and all(
        int(lo) <= int(hi)
        for lo, _, hi in (part.partition("-") for part in text.strip().split(","))
        if hi
    )
    if not ok:
        raise UsageError(f"{option} {text!r} is not a CPU list: write it as 2-5,8")
    return tuple(sorted(cpumask.parse_list(text)))
