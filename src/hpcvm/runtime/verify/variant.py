"""What a VM's memory pages and devices really are, each read where it is decided.

``hpcvm bench`` compares variants of one profile (bench/envs/variants.py: the NIC model, the
host page size under guest RAM, the guest's transparent huge pages). Each is checked in
the running VM from sources independent of hpcvm and of each other:

- the guest's THP mode: the guest kernel's ``/sys/kernel/mm/transparent_hugepage/
  enabled`` (the bracketed word), read through the agent;
- the NIC model: the driver the guest kernel bound to the interface with the NIC's MAC
  (``/sys/class/net/IF/device/driver``: ``virtio_net`` for virtio, ``e1000``);
- the host page size: QEMU's own account of each memory backend (QMP ``query-memdev``:
  its size, host nodes and policy; ``info ramblock``: the page size of the RAM block
  of the RAM block), and the kernel's account of QEMU's mappings in
  ``/proc/PID/smaps``: the mapping of each backend (QEMU 7.2 prints no host address
  for a block, so a mapping of the backend's exact size, and of a file under its
  hugetlbfs directory for a huge page backend) has ``KernelPageSize`` of the planned
  size; ``AnonHugePages`` says how much of anonymous guest RAM the host's transparent
  huge pages back, which a 4K variant records, since QEMU asks the host for them.

Pure parsers and checks over captured text; ``gather`` does the I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcvm.bootspec import Nic
from hpcvm.errors import HpcvmError
from hpcvm.nic_models import VFIO, nic_model
from hpcvm.plan.model import MemoryRegion, VMPlan
from hpcvm.runtime.machine.model import Backend, Machine
from hpcvm.runtime.verify.checks import Check, GuestExec
from hpcvm.runtime.verify.checks import check as _check
from hpcvm.units import KIB, format_size

GUEST_TIMEOUT = 120.0  # one guest-exec under TCG on a busy 2-core host
THP_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
FLAT_RAMBLOCK = "pc.ram"  # main RAM without a backend of its own (a plain flat guest)
_SEP = "@@nics@@"

# First line the THP mode, then "MAC DRIVER" per interface with a device.
GUEST_SCRIPT = f"""cat {THP_FILE} 2>/dev/null || echo
echo {_SEP}
for d in /sys/class/net/*; do
  [ -e "$d/device/driver" ] || continue
  echo "$(cat "$d/address") $(basename "$(readlink "$d/device/driver")")"
done
"""

_UNITS = {"B": 1, "KiB": KIB, "MiB": KIB**2, "GiB": KIB**3}
_BRACKETED = re.compile(r"\[(\w+)\]")


@dataclass(frozen=True)
class RamBlock:
    """One line of QEMU's ``info ramblock``: a RAM block's name and page size."""

    name: str
    page_size: int


@dataclass(frozen=True)
class SmapsEntry:
    """One mapping of ``/proc/PID/smaps``: start, size, kernel page size, THP bytes,
    the file it maps ("" for anonymous memory)."""

    start: int
    size: int
    kernel_page: int
    anon_huge: int
    path: str = ""


@dataclass(frozen=True)
class VariantSeen:
    """Everything the checks look at, gathered once."""

    guest_thp: str | None  # None: the guest could not be read, or has no THP
    nic_drivers: dict[str, str] = field(default_factory=dict)  # MAC -> driver
    guest_error: str = ""
    ramblocks: dict[str, RamBlock] = field(default_factory=dict)
    memdevs: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> query-memdev
    smaps: tuple[SmapsEntry, ...] = ()
    host_error: str = ""


# -- parsers (pure) ----------------------------------------------------------------------


def parse_thp(text: str) -> str | None:
    """The selected mode of a THP ``enabled`` file (``always [madvise] never``)."""
    match = _BRACKETED.search(text)
    return match.group(1) if match else None


def parse_guest(text: str) -> tuple[str | None, dict[str, str]]:
    """GUEST_SCRIPT's output: the THP mode and MAC -> driver."""
    thp_text, _, nics = text.partition(_SEP)
    drivers = {}
    for line in nics.splitlines():
        mac, _, driver = line.strip().partition(" ")
        if mac and driver:
            drivers[mac.lower()] = driver
    return parse_thp(thp_text), drivers


def parse_size_words(words: Sequence[str]) -> int | None:
    """``["2", "MiB"]`` -> bytes (QEMU's size_to_str)."""
    if len(words) != 2 or words[1] not in _UNITS:
        return None
    try:
        return round(float(words[0]) * _UNITS[words[1]])
    except ValueError:
        return None


def parse_ramblocks(text: str) -> dict[str, RamBlock]:
    """QEMU's ``info ramblock`` table: the block's name, then its page size (PSize, two
    words), then hex columns."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines or lines[0][:2] != ["Block", "Name"]:
        return {}
    out = {}
    for fields in lines[1:]:
        size = parse_size_words(fields[1:3]) if len(fields) >= 3 else None
        if size is not None:
            out[fields[0]] = RamBlock(name=fields[0], page_size=size)
    return out


def parse_smaps(text: str) -> list[SmapsEntry]:
    """Each mapping of an smaps file, in order."""
    out: list[SmapsEntry] = []
    head: list[str] = []
    page = huge = 0

    def close() -> None:
        if head:
            low, _, high = head[0].partition("-")
            path = " ".join(head[5:])
            out.append(SmapsEntry(int(low, 16), int(high, 16) - int(low, 16), page, huge, path))

    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if "-" in fields[0] and not fields[0].endswith(":"):
            close()
            head, page, huge = fields, 0, 0
        elif fields[0] == "KernelPageSize:":
            page = int(fields[1]) * KIB
        elif fields[0] == "AnonHugePages:":
            huge = int(fields[1]) * KIB
    close()
    return out


def backend_mappings(region: MemoryRegion, smaps: Sequence[SmapsEntry]) -> list[SmapsEntry]:
    """QEMU's mappings that can be ``region``'s: its exact size, and for a hugetlbfs
    backend a file under its directory (anonymous otherwise)."""
    return [
        e
        for e in smaps
        if e.size == region.size_bytes
        and (
            e.path.startswith(region.mem_path.rstrip("/") + "/")
            if region.backend == "file" and region.mem_path
            else not e.path.startswith("/")
        )
    ]


# -- checks (pure) -----------------------------------------------------------------------


def check_guest_thp(want: str | None, seen: VariantSeen) -> list[Check]:
    """The guest's THP mode is the one asked for (nothing to check when none was)."""
    if want is None:
        return []
    got = seen.guest_thp or f"unreadable ({seen.guest_error or 'no ' + THP_FILE})"
    return [_check("guest THP mode", want, got, seen.guest_thp == want, THP_FILE)]


def check_nic_drivers(nics: Sequence[Nic], seen: VariantSeen) -> list[Check]:
    """Each emulated NIC is driven by its model's driver in the guest."""
    out = []
    for nic in nics:
        if nic.model == VFIO:
            continue  # a passed-through VF: the device's own driver
        want = nic_model(nic.model).guest_driver
        got = seen.nic_drivers.get(nic.mac.lower(), "no interface with this MAC")
        out.append(_check(f"NIC {nic.mac} driver ({nic.model})", want, got, got == want))
    return out


def ramblock_name(plan: VMPlan, region: MemoryRegion) -> str:
    """The RAM block QEMU makes for ``region``: its backend's id, or the machine's own
    ``pc.ram`` for plain flat RAM (render/qemu.py gives that no backend)."""
    plain = (
        not plan.guest_nodes
        and region.backend == "ram"
        and not region.host_nodes
        and region.policy == "default"
        and not region.prealloc
    )
    return FLAT_RAMBLOCK if plain else region.id


def check_pages(plan: VMPlan, seen: VariantSeen) -> list[Check]:
    """Per memory region: QEMU's RAM block has the planned page size, the kernel maps
    it with pages of that size, and (for a region with a backend) QEMU's memdev has
    the planned size, host nodes and policy."""
    if seen.host_error:
        return [
            _check("guest RAM pages", "QMP and smaps readable", "failed", False, seen.host_error)
        ]
    out = []
    for region in plan.memory:
        want = format_size(region.page_size_bytes)
        name = ramblock_name(plan, region)
        block = seen.ramblocks.get(name)
        got = format_size(block.page_size) if block else "no such RAM block"
        out.append(_check(f"{name} page size (QEMU info ramblock)", want, got, got == want))
        maps = backend_mappings(region, seen.smaps)
        pages = sorted({e.kernel_page for e in maps})
        kernel = " ".join(format_size(p) for p in pages) or "no mapping of its size"
        huge = sum(e.anon_huge for e in maps)
        detail = f"{len(maps)} mapping(s), {format_size(huge) if huge else '0'} of it on host THP"
        out.append(_check(f"{name} page size (kernel smaps)", want, kernel, kernel == want, detail))
        if region.backend == "ram" and not plan.host_thp:
            got = format_size(huge) if huge else "0"
            out.append(_check(f"{name} on host THP (kernel smaps)", "0", got, huge == 0))
        if name in seen.memdevs:
            out.append(_memdev_check(region, seen.memdevs[name]))
    return out


def _memdev_check(region: MemoryRegion, memdev: Mapping[str, Any]) -> Check:
    want = (region.size_bytes, tuple(region.host_nodes), region.policy)
    got = (
        int(memdev.get("size", 0)),
        tuple(int(n) for n in memdev.get("host-nodes", [])),
        str(memdev.get("policy", "")),
    )

    def words(v: tuple[int, tuple[int, ...], str]) -> str:
        nodes = ",".join(map(str, v[1])) or "-"
        return f"{format_size(v[0])}, host nodes {nodes}, policy {v[2]}"

    return _check(f"{region.id} backend (QMP query-memdev)", words(want), words(got), got == want)


def run_checks(
    plan: VMPlan, nics: Sequence[Nic], thp: str | None, seen: VariantSeen
) -> list[Check]:
    return [*check_guest_thp(thp, seen), *check_nic_drivers(nics, seen), *check_pages(plan, seen)]


def facts(plan: VMPlan, seen: VariantSeen) -> dict[str, str]:
    """What an environment records of its variant's variables, as observed: the guest's
    THP mode, its NICs' drivers, the host page size QEMU gives guest RAM and how much of
    it the host's transparent huge pages back."""
    out: dict[str, str] = {}
    if seen.guest_thp:
        out["guest_thp"] = seen.guest_thp
    if seen.nic_drivers:
        out["guest_nic_drivers"] = " ".join(sorted(set(seen.nic_drivers.values())))
    blocks = [b for r in plan.memory if (b := seen.ramblocks.get(ramblock_name(plan, r)))]
    if blocks:
        out["host_page"] = " ".join(sorted({format_size(b.page_size) for b in blocks}))
        maps = {e for r in plan.memory for e in backend_mappings(r, seen.smaps)}
        huge = sum(e.anon_huge for e in maps)
        out["guest_ram_on_host_thp"] = format_size(huge) if huge else "0"
    return out


# -- gathering (I/O) ---------------------------------------------------------------------


def gather(machine: Machine, agent: GuestExec, backend: Backend) -> VariantSeen:
    """The guest's THP mode and NIC drivers (one guest exec), QEMU's RAM blocks and
    memdevs (QMP) and the kernel's smaps of QEMU."""
    guest_thp: str | None = None
    drivers: dict[str, str] = {}
    guest_error = ""
    try:
        result = agent.exec(["/bin/sh", "-c", GUEST_SCRIPT], timeout=GUEST_TIMEOUT)
        guest_thp, drivers = parse_guest(result.stdout)
    except HpcvmError as exc:
        guest_error = exc.message
    ramblocks: dict[str, RamBlock] = {}
    memdevs: dict[str, dict[str, Any]] = {}
    smaps: list[SmapsEntry] = []
    host_error = ""
    try:
        text = backend.qmp(machine, "human-monitor-command", {"command-line": "info ramblock"})
        ramblocks = parse_ramblocks(str(text))
        memdevs = {str(m.get("id")): m for m in backend.qmp(machine, "query-memdev")}
        smaps = parse_smaps(Path(f"/proc/{machine.pid}/smaps").read_text())
    except HpcvmError as exc:
        host_error = exc.message
    except OSError as exc:
        host_error = f"cannot read /proc/{machine.pid}/smaps: {exc.strerror}"
    return VariantSeen(
        guest_thp=guest_thp,
        nic_drivers=drivers,
        guest_error=guest_error,
        ramblocks=ramblocks,
        memdevs=memdevs,
        smaps=tuple(smaps),
        host_error=host_error,
    )
