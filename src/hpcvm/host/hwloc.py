"""hwloc's view of a machine: run ``lstopo-no-graphics`` and parse its v2 XML.

Every source (this host, a sysfs snapshot, an XML file, a synthetic description) goes
through :func:`export_xml` and then :func:`parse`, so a live host and a snapshot are read
by the very same code. The result is a plain intermediate (:class:`HwlocView`) that
``discover`` completes with what hwloc does not know (free huge pages, IOMMU groups...).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from hpcvm.errors import TopologyError
from hpcvm.host.privilege import for_admin

LSTOPO = "lstopo-no-graphics"
_TIMEOUT_S = 300  # the machine is shared and slow; hwloc itself takes milliseconds
# Keep disallowed (cgroup) PUs and nodes in the tree, and every PCI device and bridge.
_EXPORT_ARGS = ("--of", "xml", "--disallowed", "--whole-io")


# --------------------------------------------------------------------------- running


def export_xml(
    *, fsroot: Path | None = None, xml: Path | None = None, synthetic: str | None = None
) -> str:
    """hwloc's XML for this host (no argument), a sysfs root, an XML file or a
    synthetic description. Raises TopologyError when lstopo is missing or fails."""
    # The user's own HWLOC_* settings (HWLOC_XMLFILE, HWLOC_FSROOT...) would silently
    # replace the source asked for; only ours apply.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLOC_")}
    args: list[str] = [LSTOPO]
    if fsroot is not None:
        env["HWLOC_FSROOT"] = str(fsroot)
        # The x86 backend would read CPUID of THIS machine and mix it into the snapshot
        # (e.g. CPUModel), the pci one its PCI bus: the snapshot is not this system.
        env["HWLOC_COMPONENTS"] = "-x86,-pci,-opencl,-gl"
        env["HWLOC_THISSYSTEM"] = "0"
        # Hardware data dumped by hwloc-dump-hwdata (KNL memory modes), a path that
        # hwloc resolves inside the root.
        for hwdata in ("/var/run/hwloc", "/run/hwloc"):
            if (fsroot / hwdata.lstrip("/")).is_dir():
                env["HWLOC_DUMPED_HWDATA_DIR"] = hwdata
                break
    if fsroot is not None or xml is None:
        # POWER GPU memory nodes are hidden by default; they are what "memory-only"
        # nodes are about, so keep them.
        env["HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES"] = "1"
    if xml is not None:
        args += ["-i", str(xml)]
    if synthetic is not None:
        args += ["--input", synthetic]
    args += _EXPORT_ARGS
    what = _describe(fsroot=fsroot, xml=xml, synthetic=synthetic)
    if shutil.which(LSTOPO) is None:
        raise TopologyError(
            f"{LSTOPO} not found while reading {what}: "
            + for_admin("install hwloc (apt-get install hwloc)")
        )
    try:
        proc = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TopologyError(f"{LSTOPO} could not read {what}: {exc}") from exc
    if proc.returncode != 0 or not proc.stdout.strip():
        detail = _first_line(proc.stderr) or f"exit code {proc.returncode}, no output"
        raise TopologyError(f"hwloc could not read {what}: {detail}; {_fix(xml, synthetic)}")
    return proc.stdout


def _fix(xml: Path | None, synthetic: str | None) -> str:
    if xml is not None:
        return "give an hwloc v2 XML export (lstopo-no-graphics --of xml > FILE.xml)"
    if synthetic is not None:
        return 'use hwloc synthetic syntax, e.g. "pack:2 numa:2 core:8 pu:2"'
    return "check that hwloc works here (lstopo-no-graphics)"


def _describe(*, fsroot: Path | None, xml: Path | None, synthetic: str | None) -> str:
    if fsroot is not None:
        return f"sysfs root {fsroot}"
    if xml is not None:
        return f"topology file {xml}"
    if synthetic is not None:
        return f"synthetic topology {synthetic!r}"
    return "this host"


_NOISE = ("without DTD",)  # hwloc's notices that are not the error


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip() and not any(n in line for n in _NOISE):
            return line.strip()
    return ""


# --------------------------------------------------------------------------- bitmaps


def parse_bitmap(text: str | None) -> frozenset[int]:
    """hwloc's bitmap string ("0x000000ff,,0xffffffff": 32-bit words, most significant
    first, empty words are zero) as a set of indexes. A leading "0xf...f" (an infinite
    set) is dropped: callers intersect with a finite set anyway."""
    if not text:
        return frozenset()
    words = text.strip().split(",")
    if words and words[0].lower() == "0xf...f":
        words = words[1:]
    bits: set[int] = set()
    for position, word in enumerate(reversed(words)):
        if not word:
            continue
        value = int(word, 16)
        base = 32 * position
        while value:
            low = value & -value
            bits.add(base + low.bit_length() - 1)
            value ^= low
    return frozenset(bits)


# --------------------------------------------------------------------------- view


@dataclass(frozen=True)
class HwNode:
    os_index: int
    memory_bytes: int
    cpuset: frozenset[int]
    subtype: str | None
    page_types: tuple[tuple[int, int], ...]  # (size bytes, count), smallest first


@dataclass(frozen=True)
class HwCore:
    os_index: int | None
    package: int
    pus: tuple[int, ...]


@dataclass(frozen=True)
class HwPackage:
    os_index: int
    nodeset: frozenset[int]
    cpu_model: str


@dataclass(frozen=True)
class HwCache:
    level: int
    kind: str  # "unified", "data", "instruction"
    size_bytes: int
    pus: tuple[int, ...]


@dataclass(frozen=True)
class HwPci:
    bdf: str
    class_id: int
    vendor_id: int
    device_id: int
    name: str
    nodeset: frozenset[int]  # of the nearest non-I/O ancestor
    os_devices: tuple[tuple[str, int], ...]  # (name, osdev_type)
    is_bridge: bool


@dataclass(frozen=True)
class HwDistances:
    """Latency matrix between NUMA nodes in os_index order of ``indexes``."""

    indexes: tuple[int, ...]
    values: tuple[tuple[int, ...], ...]


@dataclass
class HwlocView:
    """What hwloc says about one machine, in OS numbering."""

    infos: dict[str, str] = field(default_factory=dict)
    complete_cpuset: frozenset[int] = frozenset()
    allowed_cpuset: frozenset[int] | None = None  # None: the XML does not say
    allowed_nodeset: frozenset[int] | None = None
    packages: list[HwPackage] = field(default_factory=list)
    nodes: list[HwNode] = field(default_factory=list)
    cores: list[HwCore] = field(default_factory=list)
    pus: dict[int, int] = field(default_factory=dict)  # PU os_index -> package os_index
    caches: list[HwCache] = field(default_factory=list)
    pci: list[HwPci] = field(default_factory=list)
    distances: HwDistances | None = None


_CACHE_TYPES = {
    "L1Cache": 1,
    "L2Cache": 2,
    "L3Cache": 3,
    "L4Cache": 4,
    "L5Cache": 5,
    "L1iCache": 1,
    "L2iCache": 2,
    "L3iCache": 3,
}
_CACHE_KIND = {"0": "unified", "1": "data", "2": "instruction"}


def parse(text: str, *, what: str) -> HwlocView:
    """Parse hwloc v2 XML. ``what`` names the source in error messages."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise TopologyError(f"{what}: malformed hwloc XML ({exc})") from exc
    if root.tag != "topology":
        raise TopologyError(f"{what}: not an hwloc topology (root element <{root.tag}>)")
    machine = root.find("object")
    if machine is None:
        raise TopologyError(f"{what}: hwloc XML holds no objects")
    view = HwlocView()
    view.infos = _infos(machine)
    view.complete_cpuset = parse_bitmap(machine.get("complete_cpuset") or machine.get("cpuset"))
    if machine.get("allowed_cpuset") is not None:
        view.allowed_cpuset = parse_bitmap(machine.get("allowed_cpuset"))
    if machine.get("allowed_nodeset") is not None:
        view.allowed_nodeset = parse_bitmap(machine.get("allowed_nodeset"))
    _walk(machine, view, package=-1, package_model="", nodeset=frozenset())
    if not view.pus:
        raise TopologyError(f"{what}: hwloc found no processing unit (PU) in it")
    view.distances = _numa_distances(root, view)
    return view


def _infos(obj: ET.Element) -> dict[str, str]:
    return {i.get("name", ""): i.get("value", "") for i in obj.findall("info")}


def _int(obj: ET.Element, attr: str, default: int = 0) -> int:
    value = obj.get(attr)
    return int(value) if value not in (None, "") else default


def _walk(
    obj: ET.Element, view: HwlocView, *, package: int, package_model: str, nodeset: frozenset[int]
) -> None:
    """Depth-first over the object tree, carrying the enclosing package and nodeset."""
    for child in obj.findall("object"):
        kind = child.get("type", "")
        child_nodeset = (
            parse_bitmap(child.get("complete_nodeset") or child.get("nodeset"))
            if child.get("nodeset") is not None
            else nodeset
        )
        if kind == "Package":
            os_index = _int(child, "os_index", len(view.packages))
            model = _infos(child).get("CPUModel", "").strip()
            view.packages.append(HwPackage(os_index, child_nodeset, model))
            _walk(child, view, package=os_index, package_model=model, nodeset=child_nodeset)
        elif kind == "NUMANode":
            view.nodes.append(_node(child))
        elif kind == "Core":
            pus = _pus_below(child)
            core_index = child.get("os_index")
            view.cores.append(
                HwCore(int(core_index) if core_index else None, package, tuple(sorted(pus)))
            )
            for pu in pus:
                view.pus[pu] = package
        elif kind == "PU":
            # A PU outside any Core: hwloc knew no core for it; it is its own core.
            os_index = _int(child, "os_index")
            view.cores.append(HwCore(None, package, (os_index,)))
            view.pus[os_index] = package
        elif kind in _CACHE_TYPES:
            if child.get("subtype") != "MemorySideCache":  # memory's cache, not the CPU's
                view.caches.append(_cache(child, kind))
            _walk(child, view, package=package, package_model=package_model, nodeset=child_nodeset)
        elif kind in ("PCIDev", "Bridge"):
            _pci(child, view, nodeset)
        elif kind == "OSDev":
            continue
        else:  # Machine, Group, Die, MemCache, Misc...
            _walk(child, view, package=package, package_model=package_model, nodeset=child_nodeset)


def _pus_below(core: ET.Element) -> list[int]:
    return [_int(pu, "os_index") for pu in core.iter("object") if pu.get("type") == "PU"]


def _node(obj: ET.Element) -> HwNode:
    pages = sorted(
        (_int(p, "size"), _int(p, "count")) for p in obj.findall("page_type") if _int(p, "size")
    )
    return HwNode(
        os_index=_int(obj, "os_index"),
        memory_bytes=_int(obj, "local_memory"),
        cpuset=parse_bitmap(obj.get("complete_cpuset") or obj.get("cpuset")),
        subtype=obj.get("subtype") or None,
        page_types=tuple(pages),
    )


def _cache(obj: ET.Element, kind: str) -> HwCache:
    return HwCache(
        level=_int(obj, "depth", _CACHE_TYPES[kind]),
        kind=_CACHE_KIND.get(obj.get("cache_type", "0"), "unified"),
        size_bytes=_int(obj, "cache_size"),
        pus=tuple(sorted(parse_bitmap(obj.get("complete_cpuset") or obj.get("cpuset")))),
    )


def _pci(obj: ET.Element, view: HwlocView, nodeset: frozenset[int]) -> None:
    """A PCI function (or PCI bridge) and its OS devices; recurse below bridges."""
    busid = obj.get("pci_busid")
    pci_type = obj.get("pci_type")
    if busid and pci_type:
        class_id, vendor_id, device_id = _pci_type(pci_type)
        infos = _infos(obj)
        name = " ".join(x for x in (infos.get("PCIVendor"), infos.get("PCIDevice")) if x)
        osdevs = tuple(  # its own OS devices only, not those of devices behind a bridge
            (d.get("name", ""), _int(d, "osdev_type", -1))
            for d in obj.findall("object")
            if d.get("type") == "OSDev" and d.get("name")
        )
        view.pci.append(
            HwPci(
                bdf=busid.lower(),
                class_id=class_id,
                vendor_id=vendor_id,
                device_id=device_id,
                name=name,
                nodeset=nodeset,
                os_devices=osdevs,
                is_bridge=obj.get("type") == "Bridge" or class_id in (0x0600, 0x0604),
            )
        )
    for child in obj.findall("object"):
        if child.get("type") in ("PCIDev", "Bridge"):
            _pci(child, view, nodeset)


def _pci_type(text: str) -> tuple[int, int, int]:
    """'0200 [14e4:1639] [1028:02d3] 20' -> (0x0200, 0x14e4, 0x1639)."""
    try:
        class_part, ids = text.split()[:2]
        vendor, device = ids.strip("[]").split(":")
        return int(class_part, 16), int(vendor, 16), int(device, 16)
    except ValueError:
        return 0, 0, 0


def _numa_distances(root: ET.Element, view: HwlocView) -> HwDistances | None:
    """The NUMA latency matrix (not bandwidth), re-indexed by node os_index."""
    gp_to_os = {
        _int(o, "gp_index", -1): _int(o, "os_index")
        for o in root.iter("object")
        if o.get("type") == "NUMANode"
    }
    for dist in root.iter("distances2"):
        if dist.get("type") != "NUMANode":
            continue
        kind = _int(dist, "kind")
        if kind & 8 and not kind & 4:  # HWLOC_DISTANCES_KIND_MEANS_BANDWIDTH
            continue
        # long lists are split over several <indexes> and <u64values> elements
        indexes = [int(x) for el in dist.findall("indexes") for x in (el.text or "").split()]
        if dist.get("indexing") == "gp":
            indexes = [gp_to_os.get(i, -1) for i in indexes]
        values = [int(v) for el in dist.findall("u64values") for v in (el.text or "").split()]
        n = len(indexes)
        if n == 0 or len(values) != n * n or -1 in indexes:
            continue
        rows = tuple(tuple(values[i * n : (i + 1) * n]) for i in range(n))
        return HwDistances(tuple(indexes), rows)
    return None
