"""Start the installed QEMU from rendered command lines and ask it over QMP whether the
guest it built is the planned one: vCPUs with their socket/core/thread/node, memory
backends with size, policy, host nodes, prealloc and hugetlbfs path, and ``info numa``.
Then the host side: the backends' pages sit on the planned host node (numa_maps). QEMU
runs paused (-S) under TCG, so no guest boots; it is quit and must be gone afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from qemu.qmp import QMPClient

from hpcvm.bootspec import Share
from hpcvm.plan.model import VMPlan
from hpcvm.render import BootSpec, qemu_argv
from tests import render_plans as plans
from tests.render_checks import check_qemu_argv

if TYPE_CHECKING:
    from tests.integration.conftest import HugePages

pytestmark = pytest.mark.integration

START_TIMEOUT = 120.0  # prealloc of hugetlbfs and a busy shared machine
QUIT_TIMEOUT = 60.0


@dataclass
class Observed:
    """What the running QEMU reported."""

    cpus: list[dict[str, Any]]
    memdevs: dict[str, dict[str, Any]]
    mem_paths: dict[str, str]
    info_numa: str
    status: str
    numa_maps: list[str]


async def _ask(sock: Path, pid: int) -> Observed:
    client = QMPClient("hpcvm-render-test")
    await asyncio.wait_for(client.connect(str(sock)), timeout=60)

    async def run(cmd: str, args: dict[str, str] | None = None) -> Any:
        return await client.execute(cmd, args)

    try:
        cpus = await run("query-cpus-fast")
        memdevs = {m["id"]: m for m in await run("query-memdev")}
        objects = await run("qom-list", {"path": "/objects"})
        files = [o["name"] for o in objects if o["type"] == "child<memory-backend-file>"]
        mem_paths = {
            ident: await run("qom-get", {"path": f"/objects/{ident}", "property": "mem-path"})
            for ident in files
        }
        info = await run("human-monitor-command", {"command-line": "info numa"})
        status = await run("query-status")
        numa_maps = Path(f"/proc/{pid}/numa_maps").read_text().splitlines()
        await run("quit")
    finally:
        with contextlib.suppress(EOFError, ConnectionError):  # QEMU hung up as it quit
            await client.disconnect()
    return Observed(cpus, memdevs, mem_paths, str(info), str(status["status"]), numa_maps)


@contextlib.contextmanager
def _qemu(argv: list[str], workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run QEMU as a child; yield once its QMP socket exists. Always reaped."""
    log = workdir / "qemu.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        sock = workdir / "qmp.sock"
        deadline = time.monotonic() + START_TIMEOUT
        while not sock.exists():
            if proc.poll() is not None:
                pytest.fail(f"QEMU exited with {proc.returncode}: {log.read_text().strip()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no QMP socket after {START_TIMEOUT:.0f} s: {log.read_text()}")
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=QUIT_TIMEOUT)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=QUIT_TIMEOUT)


def run_paused(plan: VMPlan, workdir: Path, hugepages: HugePages) -> Observed:
    """Start ``plan`` paused, observe it, quit it, and check it is gone."""
    if plan.hugepages_needed:  # this machine has one node: the pool is node 0's
        hugepages.ensure_free(plan.page_size_bytes, sum(plan.hugepages_needed.values()))
    boot = BootSpec(
        qmp_socket=str(workdir / "qmp.sock"), pidfile=str(workdir / "qemu.pid"), paused=True
    )
    with _qemu(qemu_argv(plan, boot), workdir) as proc:
        assert int((workdir / "qemu.pid").read_text()) == proc.pid
        observed = asyncio.run(_ask(workdir / "qmp.sock", proc.pid))
        assert proc.wait(timeout=QUIT_TIMEOUT) == 0, (workdir / "qemu.log").read_text()
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    assert not (workdir / "qemu.pid").exists()  # QEMU removes its pidfile on exit
    return observed


def check_cpus(plan: VMPlan, seen: Observed) -> None:
    assert len(seen.cpus) == plan.vcpus
    by_index = {c["cpu-index"]: c["props"] for c in seen.cpus}
    assert sorted(by_index) == list(range(plan.vcpus))
    for p in plan.placements:
        props = by_index[p.vcpu]
        want = {"socket-id": p.socket, "core-id": p.core, "thread-id": p.thread}
        if plan.topology.dies > 1:
            want["die-id"] = p.die
        if p.guest_node is not None:
            want["node-id"] = p.guest_node
        assert props == want, f"vCPU {p.vcpu}"


def _plain_flat(plan: VMPlan) -> bool:
    """Anonymous, unbound, flat: rendered as QEMU's default RAM (no backend object)."""
    if plan.guest_nodes or len(plan.memory) != 1:
        return False
    region = plan.memory[0]
    return region.backend == "ram" and region.policy == "default" and not region.prealloc


def check_memdevs(plan: VMPlan, seen: Observed) -> None:
    if _plain_flat(plan):
        (only,) = seen.memdevs.values()  # QEMU's default RAM backend
        assert only["size"] == plan.memory_bytes
        assert only["policy"] == "default"
        return
    assert set(seen.memdevs) == {r.id for r in plan.memory}
    for r in plan.memory:
        dev = seen.memdevs[r.id]
        assert dev["size"] == r.size_bytes
        assert dev["policy"] == r.policy
        assert dev["host-nodes"] == list(r.host_nodes)
        assert dev["prealloc"] == r.prealloc
        assert seen.mem_paths.get(r.id) == r.mem_path


def check_info_numa(plan: VMPlan, seen: Observed) -> None:
    lines = seen.info_numa.replace("\r", "").splitlines()
    assert lines[0] == f"{len(plan.guest_nodes)} nodes"
    for node in plan.guest_nodes:
        cpus = next(ln for ln in lines if ln.startswith(f"node {node.index} cpus:"))
        assert [int(c) for c in cpus.split(":")[1].split()] == list(node.vcpus)
        size = next(ln for ln in lines if ln.startswith(f"node {node.index} size:"))
        assert size == f"node {node.index} size: {node.memory_bytes // (1024 * 1024)} MB"


_NODE_PAGES = re.compile(r"\bN(\d+)=(\d+)")
_PAGE_KB = re.compile(r"kernelpagesize_kB=(\d+)")


def check_host_placement(plan: VMPlan, seen: Observed) -> None:
    """Every bound, preallocated region's pages are on its host node(s), under a
    ``bind`` policy: sum the numa_maps mappings with that policy and page size."""
    for r in plan.memory:
        if r.policy != "bind" or not r.prealloc:
            continue
        policy = "bind:" + ",".join(map(str, r.host_nodes))
        on_nodes = 0
        elsewhere = 0
        for line in seen.numa_maps:
            page = _PAGE_KB.search(line)
            if f" {policy} " not in line or page is None:
                continue
            if int(page.group(1)) * 1024 != r.page_size_bytes:
                continue
            for node, count in _NODE_PAGES.findall(line):
                pages = int(count) * r.page_size_bytes
                if int(node) in r.host_nodes:
                    on_nodes += pages
                else:
                    elsewhere += pages
        same = [x for x in plan.memory if x.policy == "bind" and x.host_nodes == r.host_nodes]
        planned = sum(x.size_bytes for x in same if x.page_size_bytes == r.page_size_bytes)
        assert on_nodes >= planned, f"{r.id}: {on_nodes} of {planned} bytes on {r.host_nodes}"
        assert elsewhere == 0


def check_all(plan: VMPlan, seen: Observed) -> None:
    assert seen.status == "prelaunch"  # -S: created, not running
    check_cpus(plan, seen)
    check_memdevs(plan, seen)
    check_info_numa(plan, seen)
    check_host_placement(plan, seen)


@pytest.mark.parametrize("name", plans.FITS_HERE)
def test_hand_built_plan_starts_as_planned(name: str, tmp_path: Path, hugepages: HugePages) -> None:
    plan = plans.all_plans()[name]
    check_all(plan, run_paused(plan, tmp_path, hugepages))


def test_a_wrong_plan_is_caught(tmp_path: Path, hugepages: HugePages) -> None:
    """The checks can fail: a plan whose vCPUs sit on swapped guest nodes is rendered,
    and the observation of the real QEMU disagrees with the original plan."""
    plan = plans.numa_4k()
    swapped = plan.model_copy(
        update={
            "placements": tuple(
                p.model_copy(update={"guest_node": 1 - (p.guest_node or 0)})
                for p in plan.placements
            ),
            "guest_nodes": tuple(
                n.model_copy(update={"vcpus": (1 - n.index,)}) for n in plan.guest_nodes
            ),
        }
    )
    seen = run_paused(swapped, tmp_path, hugepages)
    check_cpus(swapped, seen)
    with pytest.raises(AssertionError):
        check_cpus(plan, seen)
    with pytest.raises(AssertionError):
        check_info_numa(plan, seen)


@pytest.mark.parametrize("shape", sorted(plans.LIVE_SHAPES))
def test_planner_plan_for_this_host_starts_as_planned(
    shape: str, tmp_path: Path, hugepages: HugePages
) -> None:
    """The planner's plan for this machine, rendered, started and observed."""
    hugepages.ensure_free(plans.PAGE_2M, plans.LIVE_MEMORY // plans.PAGE_2M)
    plan = plans.live_plan(shape, f"render-live-{shape}")
    assert plan.profile == plans.LIVE_SHAPES[shape]["profile"]
    if shape == "numa":
        assert len(plan.guest_nodes) == 2
    argv = qemu_argv(plan)
    check_qemu_argv(plan, argv)
    check_all(plan, run_paused(plan, tmp_path, hugepages))


async def _ask_devices(sock: Path) -> dict[str, Any]:
    client = QMPClient("hpcvm-render-test")
    await asyncio.wait_for(client.connect(str(sock)), timeout=60)
    try:
        found: dict[str, Any] = {}
        for cmd in ("query-block", "query-chardev", "query-iothreads"):
            found[cmd] = await client.execute(cmd)
        found["iothread-of-disk"] = await client.execute(
            "qom-get", {"path": "/machine/peripheral/virtio-disk0", "property": "iothread"}
        )
        found["9p"] = [
            o["type"]
            for o in cast(
                list[dict[str, str]],
                await client.execute("qom-list", {"path": "/machine/peripheral-anon"}),
            )
            if "9p" in o["type"]
        ]
        await client.execute("quit")
    finally:
        with contextlib.suppress(EOFError, ConnectionError):
            await client.disconnect()
    return found


def test_boot_devices_are_accepted_by_qemu(tmp_path: Path, hugepages: HugePages) -> None:
    """The BootSpec groups (disk and seed on the I/O thread, 9p root share, agent
    channel, console log) on a real QEMU, paused: QEMU builds every one of them. A
    kernel is not loaded here (none on this machine outside the guest cache); the
    runtime's tests boot the built-in guest through the same renderer."""
    plan = plans.hpc_tcg()
    hugepages.ensure_free(plans.PAGE_2M, plan.memory_bytes // plans.PAGE_2M)
    disk = tmp_path / "guest.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "64M"], check=True)
    seed = tmp_path / "seed.img"
    seed.write_bytes(b"\0" * 1024 * 1024)
    boot = BootSpec(
        disk_image=str(disk),
        seed_image=str(seed),
        shares=(Share(host_path="/usr", guest_path="/usr", tag="hpcvm0"),),
        share_table=True,
        agent_socket=str(tmp_path / "qga.sock"),
        serial_log=str(tmp_path / "console.log"),
        qmp_socket=str(tmp_path / "qmp.sock"),
        pidfile=str(tmp_path / "qemu.pid"),
        paused=True,
    )
    with _qemu(qemu_argv(plan, boot), tmp_path) as proc:
        found = asyncio.run(_ask_devices(tmp_path / "qmp.sock"))
        assert proc.wait(timeout=QUIT_TIMEOUT) == 0
    blocks = {b["device"]: b["inserted"] for b in found["query-block"] if "inserted" in b}
    assert blocks["disk0"]["image"]["format"] == "qcow2"
    assert blocks["disk0"]["ro"] is False
    assert (blocks["seed0"]["image"]["format"], blocks["seed0"]["ro"]) == ("raw", True)
    chardevs = {c["label"]: c["filename"] for c in found["query-chardev"]}
    assert chardevs["qga0"] == f"disconnected:unix:{tmp_path}/qga.sock,server=on"  # listening
    assert chardevs["serial0"] == "file"  # QEMU 7.2 does not show the path: see below
    assert [t["id"] for t in found["query-iothreads"]] == ["iothread1"]
    assert found["iothread-of-disk"] == "/objects/iothread1"  # a QOM link
    assert found["9p"] == ["child<virtio-9p-pci>"]
    assert (tmp_path / "console.log").exists()  # QEMU opened the console log
