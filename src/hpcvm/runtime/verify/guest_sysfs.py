"""What the guest kernel says about its CPUs, NUMA nodes and clock, read in one agent call.

Every guest-side fact ``verify`` needs lives in small sysfs files. Reading them one by
one would cost a guest-exec round trip each (slow under TCG), so one ``/bin/sh -c`` runs
``head -v`` over all of them; ``head`` prints a ``==> path <==`` header before each
file, which ``parse_dump`` turns back into a path -> content map. The shell and ``head``
are the host's own binaries, seen by the built-in guest through its shared root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpcvm.units import KIB, parse_cpu_list

SYS = "/sys/devices/system"
_HEADER = re.compile(r"^==> (.+) <==$")
_NODE_DIR = re.compile(rf"^{SYS}/node/node(\d+)/(\w+)$")
_CPU_TOPO = re.compile(rf"^{SYS}/cpu/cpu(\d+)/topology/(\w+)$")

# nproc (CPUs this process may use) first, then every file with a header.
SCRIPT = (
    'echo "nproc=$(nproc)"; '
    f"head -v -n 64 {SYS}/cpu/online {SYS}/node/node*/cpulist {SYS}/node/node*/distance "
    f"{SYS}/node/node*/meminfo {SYS}/cpu/cpu[0-9]*/topology/physical_package_id "
    f"{SYS}/cpu/cpu[0-9]*/topology/die_id {SYS}/cpu/cpu[0-9]*/topology/core_id "
    f"{SYS}/cpu/cpu[0-9]*/topology/thread_siblings_list "
    f"{SYS}/clocksource/clocksource0/current_clocksource"
)
ARGV = ("/bin/sh", "-c", SCRIPT)


@dataclass(frozen=True)
class GuestNode:
    index: int
    cpus: tuple[int, ...]
    mem_total_bytes: int | None  # None when the node's meminfo was not readable
    distances: tuple[int, ...]


@dataclass(frozen=True)
class GuestCpu:
    index: int
    package: int
    die: int
    core: int
    siblings: tuple[int, ...]  # thread_siblings_list (SMT siblings, itself included)


@dataclass(frozen=True)
class GuestFacts:
    """The guest's view, as parsed from ``SCRIPT``'s output."""

    nproc: int | None
    online: tuple[int, ...]
    nodes: dict[int, GuestNode]
    cpus: dict[int, GuestCpu]
    clocksource: str | None


def parse_dump(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(``key=value`` lines before the first header, path -> file content)."""
    values: dict[str, str] = {}
    files: dict[str, str] = {}
    current: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        match = _HEADER.match(line)
        if match:
            if current is not None:
                files[current] = "\n".join(lines).strip()
            current, lines = match.group(1), []
        elif current is None:
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
        else:
            lines.append(line)
    if current is not None:
        files[current] = "\n".join(lines).strip()
    return values, files


def parse_mem_total(meminfo: str) -> int | None:
    """Bytes of ``Node N MemTotal:  123 kB`` in a node's meminfo."""
    for line in meminfo.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[2] == "MemTotal:":
            return int(fields[3]) * KIB
    return None


def parse_facts(text: str) -> GuestFacts:
    """GuestFacts from ``SCRIPT``'s output (missing files leave fields empty)."""
    values, files = parse_dump(text)
    node_files: dict[int, dict[str, str]] = {}
    cpu_files: dict[int, dict[str, str]] = {}
    for path, content in files.items():
        if m := _NODE_DIR.match(path):
            node_files.setdefault(int(m.group(1)), {})[m.group(2)] = content
        elif m := _CPU_TOPO.match(path):
            cpu_files.setdefault(int(m.group(1)), {})[m.group(2)] = content
    nodes = {
        n: GuestNode(
            index=n,
            cpus=tuple(parse_cpu_list(f.get("cpulist", ""))),
            mem_total_bytes=parse_mem_total(f.get("meminfo", "")),
            distances=tuple(int(d) for d in f.get("distance", "").split()),
        )
        for n, f in sorted(node_files.items())
    }
    cpus = {
        c: GuestCpu(
            index=c,
            package=int(f.get("physical_package_id", "0") or 0),
            die=int(f.get("die_id", "0") or 0),
            core=int(f.get("core_id", "0") or 0),
            siblings=tuple(parse_cpu_list(f.get("thread_siblings_list", str(c)))),
        )
        for c, f in sorted(cpu_files.items())
    }
    nproc = values.get("nproc", "")
    return GuestFacts(
        nproc=int(nproc) if nproc.isdigit() else None,
        online=tuple(parse_cpu_list(files.get(f"{SYS}/cpu/online", ""))),
        nodes=nodes,
        cpus=cpus,
        clocksource=files.get(f"{SYS}/clocksource/clocksource0/current_clocksource") or None,
    )
