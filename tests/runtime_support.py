"""Shared helpers for the runtime tests: what a VM may leave behind, and a tiny plan.

``Residue.take()`` records everything a VM could leak (QEMU processes started from the
test's runtime directory, entries in that directory, hpcvm's hugetlbfs directories and
files, huge pages in use, tap devices); ``assert_nothing_left(before)`` fails with the
list of what is left. Every runtime test that starts or refuses a VM ends with it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from hpcvm.plan.model import CpuModel, CpuTopology, MemoryRegion, PlanRequest, VcpuPlacement, VMPlan

MIB = 1024 * 1024
PAGE_2M = 2 * MIB
_SYS_HUGEPAGES = Path("/sys/kernel/mm/hugepages")
_TAP_PREFIXES = ("tap", "vnet", "macvtap")


def _hugetlbfs_mounts() -> list[str]:
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "hugetlbfs":
            out.append(fields[1])
    return out


def qemu_pids_using(runtime_dir: Path) -> set[int]:
    """Live (non-zombie) QEMU processes whose command line mentions ``runtime_dir``."""
    found: set[int] = set()
    needle = str(runtime_dir).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        zombie = stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X")
        if b"qemu-system" in cmdline and needle in cmdline and not zombie:
            found.add(int(entry))
    return found


def hpcvm_hugetlbfs_entries() -> list[str]:
    """hpcvm's per-VM directories and any file in them, on every hugetlbfs mount."""
    out: list[str] = []
    for mount in _hugetlbfs_mounts():
        try:
            children = list(Path(mount).iterdir())
        except OSError:
            continue
        for child in children:
            if child.name.startswith("hpcvm-"):
                out.append(str(child))
                if child.is_dir():
                    out += [str(f) for f in child.iterdir()]
    return out


def hugepages_in_use() -> dict[int, int]:
    """Page size in bytes -> huge pages in use (total - free), host-wide."""
    used: dict[int, int] = {}
    for pool in _SYS_HUGEPAGES.iterdir():
        size = int(pool.name.removeprefix("hugepages-").removesuffix("kB")) * 1024
        total = int((pool / "nr_hugepages").read_text())
        free = int((pool / "free_hugepages").read_text())
        used[size] = total - free
    return used


def tap_devices() -> set[str]:
    return {n for n in os.listdir("/sys/class/net") if n.startswith(_TAP_PREFIXES)}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass(frozen=True)
class Residue:
    runtime_dir: Path
    qemu_pids: frozenset[int]
    run_dirs: tuple[str, ...]
    hugetlbfs: tuple[str, ...]
    hugepages_used: dict[int, int]
    taps: frozenset[str]

    @classmethod
    def take(cls, runtime_dir: Path) -> Residue:
        runs = sorted(p.name for p in runtime_dir.iterdir()) if runtime_dir.is_dir() else []
        return cls(
            runtime_dir=runtime_dir,
            qemu_pids=frozenset(qemu_pids_using(runtime_dir)),
            run_dirs=tuple(runs),
            hugetlbfs=tuple(hpcvm_hugetlbfs_entries()),
            hugepages_used=hugepages_in_use(),
            taps=frozenset(tap_devices()),
        )

    def leftovers(self, before: Residue) -> list[str]:
        problems: list[str] = []
        if self.qemu_pids - before.qemu_pids:
            problems.append(f"QEMU still running: pids {sorted(self.qemu_pids - before.qemu_pids)}")
        extra_runs = sorted(set(self.run_dirs) - set(before.run_dirs))
        if extra_runs:
            problems.append(f"run dirs/sockets left in {self.runtime_dir}: {extra_runs}")
        extra_huge = sorted(set(self.hugetlbfs) - set(before.hugetlbfs))
        if extra_huge:
            problems.append(f"hugetlbfs entries left: {extra_huge}")
        for size, used in self.hugepages_used.items():
            if used > before.hugepages_used.get(size, 0):
                problems.append(
                    f"{used - before.hugepages_used.get(size, 0)} more {size // 1024} kB huge "
                    "pages in use than before"
                )
        if self.taps - before.taps:
            problems.append(f"tap devices left: {sorted(self.taps - before.taps)}")
        return problems


def assert_nothing_left(before: Residue, *, settle: float = 30.0) -> None:
    """Fail unless nothing a VM could leak is left compared with ``before``.

    Waits up to ``settle`` seconds: the kernel frees a dead QEMU's huge pages
    asynchronously, and other people's guests on this machine take and free pages too.
    """
    deadline = time.monotonic() + settle
    while True:
        problems = Residue.take(before.runtime_dir).leftovers(before)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not problems, "; ".join(problems)


def tiny_plan(
    name: str = "t",
    *,
    vcpus: int = 1,
    pus: tuple[int | None, ...] | None = None,
    emulator_pus: tuple[int, ...] = (),
    memory: int = 256 * MIB,
    hugetlbfs: str | None = None,
) -> VMPlan:
    """A hand-written flat plan (input data for runtime tests that do not test the
    planner): ``pus`` pins vCPU i to pus[i]; ``hugetlbfs`` backs RAM with 2M pages."""
    pus = pus if pus is not None else (None,) * vcpus
    region = MemoryRegion(
        id="ram0",
        size_bytes=memory,
        guest_node=None,
        backend="file" if hugetlbfs else "ram",
        page_size_bytes=PAGE_2M if hugetlbfs else 4096,
        mem_path=hugetlbfs,
        prealloc=bool(hugetlbfs),
    )
    return VMPlan(
        name=name,
        profile="pinned" if any(p is not None for p in pus) else "naive",
        request=PlanRequest(
            name=name, profile="naive", vcpus=vcpus, memory_bytes=memory, accel="tcg"
        ),
        host_source="test",
        accel="tcg",
        accel_reason="test",
        vcpus=vcpus,
        memory_bytes=memory,
        topology=CpuTopology(sockets=1, cores=vcpus, threads=1),
        placements=tuple(
            VcpuPlacement(vcpu=i, socket=0, core=i, thread=0, guest_node=None, host_pu=pu)
            for i, pu in enumerate(pus)
        ),
        guest_nodes=(),
        guest_distances=(),
        memory=(region,),
        page_size_bytes=region.page_size_bytes,
        emulator_pus=emulator_pus,
        cpu=CpuModel(model=None),
        clock="test",
    )
