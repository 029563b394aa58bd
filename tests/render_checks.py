"""Whole-output checks: a rendered QEMU argv or libvirt domain, read back, equals the
plan it came from. Derived from the plan's data only (no profile-specific knowledge),
so they apply to planner plans for any host as well as to the hand-built ones."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hpcvm.plan.model import VMPlan
from hpcvm.units import parse_cpu_list
from tests import render_parse as rp


def plain_flat(plan: VMPlan) -> bool:
    """A flat guest on anonymous, unbound, not preallocated memory: QEMU's default RAM."""
    if plan.guest_nodes or len(plan.memory) != 1:
        return False
    r = plan.memory[0]
    return r.backend == "ram" and r.policy == "default" and not r.host_nodes and not r.prealloc


def check_qemu_argv(plan: VMPlan, argv: list[str]) -> None:
    grouped = rp.group_argv(argv)
    assert {"-nodefaults", "-no-user-config"} <= {o for o, _ in grouped}
    _check_smp(plan, argv)
    _check_backends(plan, argv)
    _check_numa(plan, argv)
    assert len(rp.objects(argv, "iothread")) == plan.iothreads
    devices = [rp.parse_opts(v) for v in rp.values(argv, "-device")]
    vfio = [d.get("host") for d in devices if d.head == "vfio-pci"]
    planned = [b for dev in plan.passthrough for b in (dev.bdf, *dev.group_members)]
    assert vfio == list(dict.fromkeys(planned))
    accel = rp.parse_opts(_one(argv, "-accel"))
    assert accel.head == plan.accel
    cpu = rp.values(argv, "-cpu")
    wanted = [plan.cpu.model, *(f"+{f}" for f in plan.cpu.features)]
    assert (rp.split_opts(cpu[0]) if cpu else [None]) == wanted


def _one(argv: list[str], option: str) -> str:
    (value,) = rp.values(argv, option)
    return value


def _check_smp(plan: VMPlan, argv: list[str]) -> None:
    smp = rp.parse_opts(_one(argv, "-smp"))
    assert smp.head == str(plan.vcpus)
    t = plan.topology
    if not smp.pairs:  # plain -smp N: QEMU 7.x makes one socket of N cores
        assert (t.sockets, t.dies, t.cores, t.threads) == (1, 1, plan.vcpus, 1)
        return
    shape = [int(smp.get(k) or 0) for k in ("sockets", "dies", "cores", "threads")]
    assert shape == [t.sockets, t.dies, t.cores, t.threads]
    assert shape[0] * shape[1] * shape[2] * shape[3] == plan.vcpus


def _check_backends(plan: VMPlan, argv: list[str]) -> None:
    assert rp.size(_one(argv, "-m"), default_unit="M") == plan.memory_bytes
    backends = {**rp.objects(argv, "memory-backend-ram"), **rp.objects(argv, "memory-backend-file")}
    machine = rp.parse_opts(_one(argv, "-machine"))
    assert machine.head == "q35"
    if plain_flat(plan):
        assert backends == {}
        assert machine.get("memory-backend") is None
        return
    assert set(backends) == {r.id for r in plan.memory}
    flat = not plan.guest_nodes
    assert machine.get("memory-backend") == (plan.memory[0].id if flat else None)
    for r in plan.memory:
        o = backends[r.id]
        kind = "memory-backend-file" if r.backend == "file" else "memory-backend-ram"
        assert o.head == kind
        assert rp.size(o.get("size") or "") == r.size_bytes
        assert o.get("mem-path") == r.mem_path
        assert [int(n) for n in o.all("host-nodes")] == list(r.host_nodes)
        assert (o.get("policy") or "default") == r.policy
        assert (o.get("prealloc") == "on") == r.prealloc


def _check_numa(plan: VMPlan, argv: list[str]) -> None:
    nodes, cpus = rp.numa(argv, "node"), rp.numa(argv, "cpu")
    if not plan.guest_nodes:
        assert nodes == cpus == rp.numa(argv, "dist") == []
        return
    assert {int(o.get("nodeid") or -1): o.get("memdev") for o in nodes} == {
        r.guest_node: r.id for r in plan.memory
    }
    seen = {}
    for o in cpus:
        key = tuple(int(o.get(k) or 0) for k in ("socket-id", "die-id", "core-id", "thread-id"))
        assert key not in seen
        seen[key] = int(o.get("node-id") or -1)
    planned = {(p.socket, p.die, p.core, p.thread): p.guest_node for p in plan.placements}
    assert seen == planned
    n = len(plan.guest_nodes)
    assert rp.distance_matrix(argv, n) == [list(row) for row in plan.guest_distances]


def _cpuset(element: ET.Element | None) -> list[int]:
    return sorted(parse_cpu_list(element.get("cpuset") or "")) if element is not None else []


def check_libvirt_domain(plan: VMPlan, text: str) -> None:
    dom = ET.fromstring(text)
    assert dom.get("type") == ("kvm" if plan.accel == "kvm" else "qemu")
    assert int(dom.findtext("vcpu") or 0) == plan.vcpus
    assert int(dom.findtext("memory") or 0) * 1024 == plan.memory_bytes
    pins = {int(p.get("vcpu") or -1): _cpuset(p) for p in dom.findall("cputune/vcpupin")}
    assert pins == {p.vcpu: [p.host_pu] for p in plan.placements if p.host_pu is not None}
    assert _cpuset(dom.find("cputune/emulatorpin")) == sorted(plan.emulator_pus)
    iopins = dom.findall("cputune/iothreadpin")
    assert len(iopins) == (plan.iothreads if plan.iothread_pus else 0)
    assert all(_cpuset(p) == sorted(plan.iothread_pus) for p in iopins)
    topo = dom.find("cpu/topology")
    assert topo is not None
    t = plan.topology
    assert [int(topo.get(k) or 0) for k in ("sockets", "dies", "cores", "threads")] == [
        t.sockets,
        t.dies,
        t.cores,
        t.threads,
    ]
    _check_cells(plan, dom)
    _check_memory(plan, dom)


def _check_cells(plan: VMPlan, dom: ET.Element) -> None:
    cells = dom.findall("cpu/numa/cell")
    assert [int(c.get("id") or -1) for c in cells] == [n.index for n in plan.guest_nodes]
    assert [parse_cpu_list(c.get("cpus") or "") for c in cells] == [
        list(n.vcpus) for n in plan.guest_nodes
    ]
    assert [int(c.get("memory") or 0) * 1024 for c in cells] == [
        n.memory_bytes for n in plan.guest_nodes
    ]
    distances = tuple(
        tuple(int(s.get("value") or 0) for s in c.findall("distances/sibling")) for c in cells
    )
    assert distances == plan.guest_distances


def _check_memory(plan: VMPlan, dom: ET.Element) -> None:
    bound = [r for r in plan.memory if r.policy == "bind" and r.host_nodes]
    memnodes = {
        int(m.get("cellid") or -1): parse_cpu_list(m.get("nodeset") or "")
        for m in dom.findall("numatune/memnode")
    }
    assert memnodes == {r.guest_node: list(r.host_nodes) for r in bound if r.guest_node is not None}
    nodeset = dom.find("numatune/memory")
    all_nodes = sorted({n for r in bound for n in r.host_nodes})
    stated = parse_cpu_list(nodeset.get("nodeset") or "") if nodeset is not None else []
    assert stated == all_nodes
    pages = {
        int(p.get("size") or 0) * 1024: parse_cpu_list(p.get("nodeset") or "")
        for p in dom.findall("memoryBacking/hugepages/page")
    }
    huge = [r for r in plan.memory if r.backend == "file"]
    assert pages == {
        size: [r.guest_node for r in huge if r.page_size_bytes == size and r.guest_node is not None]
        for size in {r.page_size_bytes for r in huge}
    }
