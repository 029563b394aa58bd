"""Pin QEMU's threads as the plan says, and prove that it took.

Each vCPU thread goes to its planned PU; every other QEMU thread (main loop, I/O
threads, RCU, worker pools) goes to ``plan.emulator_pus`` when the plan restricts them.
Affinities are then read back from the kernel: a cpuset/cgroup can silently narrow a
mask, and a pinning that did not take would make every later measurement a lie.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcvm.errors import RuntimeFailure
from hpcvm.plan.model import VMPlan
from hpcvm.units import format_cpu_list


@dataclass(frozen=True)
class ThreadAffinity:
    """One QEMU thread, its role and the PUs it may run on."""

    tid: int
    role: str  # "vcpu<N>" or the thread's name (comm)
    pus: frozenset[int]


def threads_of(pid: int) -> list[int]:
    """Thread ids of process ``pid`` (empty when it is gone)."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return []


def thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def wanted_affinities(
    plan: VMPlan, pid: int, vcpu_threads: Mapping[int, int]
) -> dict[int, frozenset[int]]:
    """tid -> PUs the plan wants; threads the plan leaves free are absent."""
    wanted: dict[int, frozenset[int]] = {}
    for placement in plan.placements:
        if placement.host_pu is None:
            continue
        tid = vcpu_threads.get(placement.vcpu)
        if tid is None:
            raise RuntimeFailure(f"QEMU reports no thread for vCPU {placement.vcpu}", cause="qemu")
        wanted[tid] = frozenset({placement.host_pu})
    if plan.emulator_pus:
        vcpu_tids = set(vcpu_threads.values())
        for tid in threads_of(pid):
            if tid not in vcpu_tids:
                wanted[tid] = frozenset(plan.emulator_pus)
    return wanted


def apply(wanted: Mapping[int, frozenset[int]]) -> None:
    """Set each thread's affinity; a thread that exited meanwhile is skipped."""
    for tid, pus in wanted.items():
        try:
            os.sched_setaffinity(tid, pus)
        except ProcessLookupError:
            continue
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot pin thread {tid} to PUs {format_cpu_list(sorted(pus))}: {exc.strerror}"
            ) from exc


def read_back(pid: int, vcpu_threads: Mapping[int, int]) -> list[ThreadAffinity]:
    """Every live thread of ``pid`` with its current affinity, from the kernel."""
    roles = {tid: f"vcpu{index}" for index, tid in vcpu_threads.items()}
    out: list[ThreadAffinity] = []
    for tid in threads_of(pid):
        with contextlib.suppress(ProcessLookupError):
            pus = frozenset(os.sched_getaffinity(tid))
            out.append(ThreadAffinity(tid, roles.get(tid) or thread_name(pid, tid), pus))
    return out


def mismatches(
    plan: VMPlan, pid: int, vcpu_threads: Mapping[int, int], actual: list[ThreadAffinity]
) -> list[str]:
    """What differs between the plan and ``actual``, one phrase per thread."""
    wanted = wanted_affinities(plan, pid, vcpu_threads)
    problems: list[str] = []
    seen = {t.tid: t for t in actual}
    for tid, pus in wanted.items():
        got = seen.get(tid)
        if got is None:
            if tid in vcpu_threads.values():
                problems.append(f"vCPU thread {tid} is gone")
            continue
        if got.pus != pus:
            problems.append(
                f"{got.role} (tid {tid}) on PUs {format_cpu_list(sorted(got.pus))}, "
                f"planned {format_cpu_list(sorted(pus))}"
            )
    return problems


def pin(plan: VMPlan, pid: int, vcpu_threads: Mapping[int, int]) -> list[ThreadAffinity]:
    """Pin QEMU ``pid`` as planned, read back, and fail if anything did not take."""
    apply(wanted_affinities(plan, pid, vcpu_threads))
    return check(plan, pid, vcpu_threads)


def check(plan: VMPlan, pid: int, vcpu_threads: Mapping[int, int]) -> list[ThreadAffinity]:
    """Read the affinities of QEMU ``pid`` and fail with the first mismatch."""
    actual = read_back(pid, vcpu_threads)
    problems = mismatches(plan, pid, vcpu_threads, actual)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RuntimeFailure(f"pinning did not take: {problems[0]}{more}")
    return actual
