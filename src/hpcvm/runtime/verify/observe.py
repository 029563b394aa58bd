"""Host-side reads of a running QEMU, for ``verify``: thread affinities and where its
memory lives.

The parsers take the text of the /proc files so they can be tested on captured text;
the readers only open the files. Everything is read from the kernel, never from what
QEMU or libvirt say they did: verification must observe, not trust.

- Affinity: ``Cpus_allowed_list`` in ``/proc/<pid>/task/<tid>/status`` (the kernel's
  mask after any cpuset narrowing).
- Memory: ``/proc/<pid>/numa_maps`` gives per mapping the memory policy (``bind:0``),
  whether it is hugetlb (``huge``), the page size and the pages present per node
  (``N0=128``); ``/proc/<pid>/maps`` gives each mapping's size. These counts are exact
  for this one process, unlike the host-wide huge page pools that other VMs share.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hpcvm.errors import RuntimeFailure
from hpcvm.units import KIB, parse_cpu_list

_NODE_COUNT = re.compile(r"^N(\d+)=(\d+)$")


@dataclass(frozen=True)
class ThreadInfo:
    """One thread of a process: id, name (comm) and the PUs it may run on."""

    tid: int
    name: str
    pus: frozenset[int]


@dataclass(frozen=True)
class Mapping:
    """One line of numa_maps, with its size from maps (0 when maps lacked it)."""

    start: int
    policy: str  # "default", "bind", "interleave", "prefer", "local", ...
    policy_nodes: frozenset[int]  # the nodes after the policy's ':' (empty for default)
    huge: bool  # hugetlb mapping
    page_size: int  # bytes (kernelpagesize_kB)
    pages: dict[int, int] = field(default_factory=dict)  # node -> pages present
    path: str = ""  # file=... (hugetlbfs file, memfd), "" for anonymous
    size: int = 0

    @property
    def bytes_by_node(self) -> dict[int, int]:
        return {node: count * self.page_size for node, count in self.pages.items()}


# -- parsers (pure) ---------------------------------------------------------------------


def parse_cpus_allowed(status_text: str) -> frozenset[int]:
    """The ``Cpus_allowed_list`` of a /proc status file."""
    for line in status_text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return frozenset(parse_cpu_list(line.split(":", 1)[1].strip()))
    raise ValueError("no Cpus_allowed_list line in the status text")


def parse_policy(text: str) -> tuple[str, frozenset[int]]:
    """``bind:0-1`` -> ("bind", {0, 1}); ``bind=static:0`` keeps "bind"; ``default``."""
    name, _, nodes = text.partition(":")
    name = name.split("=", 1)[0]
    return name, frozenset(parse_cpu_list(nodes)) if nodes else frozenset()


def parse_numa_maps(text: str) -> list[Mapping]:
    """Every line of /proc/<pid>/numa_maps (sizes left 0; see ``with_sizes``)."""
    out: list[Mapping] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        policy, nodes = parse_policy(fields[1])
        pages: dict[int, int] = {}
        page_kib = 4
        huge = False
        path = ""
        for item in fields[2:]:
            match = _NODE_COUNT.match(item)
            if match:
                pages[int(match.group(1))] = int(match.group(2))
            elif item.startswith("kernelpagesize_kB="):
                page_kib = int(item.split("=", 1)[1])
            elif item == "huge":
                huge = True
            elif item.startswith("file="):
                path = item.split("=", 1)[1]
        out.append(
            Mapping(
                start=int(fields[0], 16),
                policy=policy,
                policy_nodes=nodes,
                huge=huge,
                page_size=page_kib * KIB,
                pages=pages,
                path=path,
            )
        )
    return out


def parse_maps_sizes(text: str) -> dict[int, int]:
    """Start address -> size of each mapping in /proc/<pid>/maps."""
    sizes: dict[int, int] = {}
    for line in text.splitlines():
        span = line.split(maxsplit=1)[0] if line.strip() else ""
        start, sep, end = span.partition("-")
        if sep:
            sizes[int(start, 16)] = int(end, 16) - int(start, 16)
    return sizes


def with_sizes(mappings: Iterable[Mapping], sizes: dict[int, int]) -> list[Mapping]:
    """numa_maps lines with the sizes that maps gives for the same start addresses."""
    out = []
    for m in mappings:
        out.append(
            Mapping(
                start=m.start,
                policy=m.policy,
                policy_nodes=m.policy_nodes,
                huge=m.huge,
                page_size=m.page_size,
                pages=m.pages,
                path=m.path,
                size=sizes.get(m.start, 0),
            )
        )
    return out


def huge_pages_by_node(mappings: Iterable[Mapping], page_size: int) -> dict[int, int]:
    """Huge pages of ``page_size`` present per host node in these mappings."""
    out: dict[int, int] = {}
    for m in mappings:
        if m.huge and m.page_size == page_size:
            for node, count in m.pages.items():
                out[node] = out.get(node, 0) + count
    return out


# -- readers (I/O) ----------------------------------------------------------------------


def _read(path: Path, pid: int) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise RuntimeFailure(f"QEMU process {pid} is gone (no {path})") from None
    except OSError as exc:
        raise RuntimeFailure(f"cannot read {path}: {exc.strerror}") from exc


def threads(pid: int) -> list[ThreadInfo]:
    """Every thread of ``pid`` with its name and allowed PUs."""
    task = Path(f"/proc/{pid}/task")
    try:
        tids = sorted(int(t) for t in (p.name for p in task.iterdir()))
    except FileNotFoundError:
        raise RuntimeFailure(f"QEMU process {pid} is gone (no {task})") from None
    out = []
    for tid in tids:
        try:
            status = (task / str(tid) / "status").read_text()
            name = (task / str(tid) / "comm").read_text().strip()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        out.append(ThreadInfo(tid, name, parse_cpus_allowed(status)))
    return out


def memory_mappings(pid: int) -> list[Mapping]:
    """numa_maps of ``pid`` with each mapping's size."""
    numa = _read(Path(f"/proc/{pid}/numa_maps"), pid)
    maps = _read(Path(f"/proc/{pid}/maps"), pid)
    return with_sizes(parse_numa_maps(numa), parse_maps_sizes(maps))


def host_pool(node: int, page_size: int, root: Path = Path("/")) -> tuple[int, int] | None:
    """(total, free) huge pages of ``page_size`` on host ``node``; None if absent."""
    pool = root / (f"sys/devices/system/node/node{node}/hugepages/hugepages-{page_size // KIB}kB")
    try:
        total = int((pool / "nr_hugepages").read_text())
        free = int((pool / "free_hugepages").read_text())
    except (OSError, ValueError):
        return None
    return total, free
