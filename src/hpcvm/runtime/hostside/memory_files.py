"""Where a plan's file-backed memory lives on this host: the hugetlbfs mounts its
regions name, and the VM's private directory in each (runtime/hostside/hugetlbfs.py says
why a VM gets one).

Why a module of its own: ``up`` prepares these files before QEMU starts and records the
private directories so that ``down`` (or a failed ``up``) removes them; what a plan's
regions need from the host is host-side preparation, apart from the VM's start.
"""

from __future__ import annotations

from pathlib import Path

from hpcvm.plan.model import MemoryRegion, VMPlan
from hpcvm.runtime.hostside import hugetlbfs, paths


def ensure_mounts(plan: VMPlan) -> None:
    """Every hugetlbfs mount the plan's file-backed regions use, mounted (or refused)."""
    for region in plan.memory:
        if region.backend == "file" and region.mem_path:
            hugetlbfs.ensure_mount(region.mem_path, region.page_size_bytes)


def private_dirs(plan: VMPlan, name: str) -> tuple[VMPlan, list[str]]:
    """The plan with each file-backed region in VM ``name``'s own directory inside its
    mount (one per mount), and those directories; on failure none is left."""
    made: dict[str, str] = {}
    regions: list[MemoryRegion] = []
    try:
        for region in plan.memory:
            if region.backend == "file" and region.mem_path:
                if region.mem_path not in made:
                    made[region.mem_path] = str(
                        hugetlbfs.make_vm_dir(region.mem_path, name, paths.runtime_root())
                    )
                region = region.model_copy(update={"mem_path": made[region.mem_path]})
            regions.append(region)
    except BaseException:
        for directory in made.values():
            hugetlbfs.remove_vm_dir(Path(directory))
        raise
    return plan.model_copy(update={"memory": tuple(regions)}), list(made.values())
