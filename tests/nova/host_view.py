"""A machine as Nova's libvirt driver would see it, from hwloc's own XML (not from
hpcvm's host model): PUs per NUMA node, SMT siblings per core, memory per node. The
Nova host built from it (``nova_host``) is what tests/nova/check_flavor.py fits flavors
onto."""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KIB = 1024


def bits(text: str | None) -> frozenset[int]:
    """An hwloc bitmap ("0xff,,0x1": 32-bit words, most significant first)."""
    if not text:
        return frozenset()
    out: set[int] = set()
    for pos, word in enumerate(reversed(text.split(","))):
        value = int(word, 16) if word and "..." not in word else 0
        out |= {32 * pos + i for i in range(32) if value >> i & 1}
    return frozenset(out)


@dataclass(frozen=True)
class HwlocMachine:
    """``nodes``: node os_index -> (its usable PUs, its memory in bytes); ``cores``:
    each core's usable PUs (siblings); ``smt``: some core has more than one PU."""

    nodes: dict[int, tuple[frozenset[int], int]]
    cores: tuple[frozenset[int], ...]
    smt: bool

    def node_of(self, pu: int) -> int | None:
        return next((n for n, (pus, _) in self.nodes.items() if pu in pus), None)

    def core_of(self, pu: int) -> int:
        return next(i for i, core in enumerate(self.cores) if pu in core)


def lstopo_xml(*, fsroot: Path | None = None, xml: Path | None = None) -> str:
    """hwloc's XML of a sysfs snapshot (``fsroot``) or of an XML export, as the
    planner tests get it (the same environment, so the same machine)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLOC_")}
    env["HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES"] = "1"
    args = ["lstopo-no-graphics", "--of", "xml", "--disallowed"]
    if fsroot is not None:
        env.update(HWLOC_FSROOT=str(fsroot), HWLOC_THISSYSTEM="0")
        env["HWLOC_COMPONENTS"] = "-x86,-pci,-opencl,-gl"
    if xml is not None:
        args[1:1] = ["-i", str(xml)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=True)
    return done.stdout


def machine(text: str) -> HwlocMachine:
    root = ET.fromstring(text).find("object")
    assert root is not None
    usable = bits(root.get("cpuset")) & bits(root.get("allowed_cpuset") or root.get("cpuset"))
    nodes: dict[int, tuple[frozenset[int], int]] = {}
    cores: list[frozenset[int]] = []
    smt = False
    for obj in root.iter("object"):
        kind = obj.get("type")
        if kind == "NUMANode":
            memory = int(obj.get("local_memory", "0"))
            nodes[int(obj.get("os_index", "0"))] = (_node_cpus(obj, usable, nodes), memory)
        elif kind == "Core":
            pus = bits(obj.get("complete_cpuset") or obj.get("cpuset"))
            smt = smt or len(pus) > 1
            if pus & usable:
                cores.append(pus & usable)
    covered = frozenset().union(*cores) if cores else frozenset()
    cores += [frozenset({pu}) for pu in sorted(usable - covered)]  # PUs without a Core
    return HwlocMachine(nodes=nodes, cores=tuple(cores), smt=smt)


def _node_cpus(
    obj: ET.Element, usable: frozenset[int], seen: dict[int, tuple[frozenset[int], int]]
) -> frozenset[int]:
    """The PUs Linux lists in this node (node*/cpulist, what libvirt reports per cell).
    hwloc gives a memory-only node (subtype MCDRAM, GPUMemory, ...) the cpuset of the
    CPUs near it, shared with their own node: those PUs are not the memory-only node's,
    or Nova's cells would hold the same PUs twice (and pin two guest cells on one PU)."""
    pus = bits(obj.get("cpuset")) & usable
    claimed = frozenset().union(*(cpus for cpus, _ in seen.values())) if seen else frozenset()
    if obj.get("subtype") or pus & claimed:
        return frozenset()
    return pus


def nova_host(
    hw: HwlocMachine,
    pools: dict[int, dict[int, int]],
    dedicated: tuple[int, ...],
    shared: tuple[int, ...],
) -> dict[str, Any]:
    """check_flavor.py's host: one cell per hwloc node (memory-only nodes too, as
    libvirt reports them) with its siblings, its memory, and its page pools; ``pools``
    is node -> {page size in bytes: count} (the huge pages the test reserved); the
    small-page pool is the rest of the node's memory."""
    cells = []
    for node, (pus, memory) in sorted(hw.nodes.items()):
        huge = pools.get(node, {})
        small = (memory - sum(size * count for size, count in huge.items())) // (4 * KIB)
        pages = [[4, small]] + [[size // KIB, count] for size, count in sorted(huge.items())]
        cells.append(
            {
                "id": node,
                "cpus": sorted(pus),
                "siblings": [sorted(core) for core in hw.cores if core & pus],
                "memory_mib": memory // (KIB * KIB),
                "pages": pages,
            }
        )
    return {"cells": cells, "dedicated": list(dedicated), "shared": list(shared), "smt": hw.smt}
