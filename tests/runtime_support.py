"""Shared helpers for the runtime tests: what a VM may leave behind, and a tiny plan.

``Residue.take()`` records everything a VM could leak (QEMU processes started from the
test's runtime directory, entries in that directory, hpcvm's hugetlbfs directories and
files, huge pages in use, tap devices); ``assert_nothing_left(before)`` fails with the
list of what is left. Every runtime test that starts or refuses a VM ends with it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcvm.plan.model import CpuModel, CpuTopology, MemoryRegion, PlanRequest, VcpuPlacement, VMPlan
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.hostside.hugetlbfs import vm_dir_prefix

MIB = 1024 * 1024
PAGE_2M = 2 * MIB
_SYS_HUGEPAGES = Path("/sys/kernel/mm/hugepages")
_TAP_PREFIXES = ("tap", "vnet", "macvtap", "hv")  # hv: hpcvm's own taps (runtime/net/network.py)


def _hugetlbfs_mounts() -> list[str]:
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "hugetlbfs":
            out.append(fields[1])
    return out


def qemu_pids_using(runtime_dir: Path, program: bytes = b"qemu-system") -> set[int]:
    """Live (non-zombie) QEMU processes (or others whose command line holds
    ``program``) whose command line mentions ``runtime_dir``."""
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
        if program in cmdline and needle in cmdline and not zombie:
            found.add(int(entry))
    return found


def relay_pids_using(runtime_dir: Path) -> set[int]:
    """Live agent relays of VMs in ``runtime_dir`` (their command line names the relay
    socket's pid file in it)."""
    return qemu_pids_using(runtime_dir, b"hpcvm.runtime.channels.agent_relay")


def hpcvm_hugetlbfs_entries(runtime_dir: Path) -> list[str]:
    """The per-VM hugetlbfs directories of VMs under ``runtime_dir`` and their files."""
    prefix = vm_dir_prefix(runtime_dir)
    out: list[str] = []
    for mount in _hugetlbfs_mounts():
        try:
            children = list(Path(mount).iterdir())
        except OSError:
            continue
        for child in children:
            if child.name.startswith(prefix):
                out.append(str(child))
                if child.is_dir():
                    out += [str(f) for f in child.iterdir()]
    return out


def hugetlb_bytes_held_by_others(exclude: set[int]) -> int:
    """Huge page bytes mapped by live processes outside ``exclude`` (smaps_rollup)
    plus those held by files on hugetlbfs mounts: what other people's guests hold."""
    held = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            text = Path(f"/proc/{entry}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(("Private_Hugetlb:", "Shared_Hugetlb:")):
                held += int(line.split()[1]) * 1024
    for mount in _hugetlbfs_mounts():
        for root, _dirs, files in os.walk(mount):
            for name in files:
                with contextlib.suppress(OSError):
                    held += os.stat(os.path.join(root, name)).st_blocks * 512
    return held


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
    """Tap-like links in this network namespace, asked of the kernel over netlink (ip):
    /sys/class/net shows the namespace that mounted /sys, not necessarily this one."""
    out = subprocess.run(
        ["ip", "-j", "link", "show"], capture_output=True, text=True, check=True
    ).stdout
    return {
        link["ifname"]
        for link in json.loads(out or "[]")
        if str(link.get("ifname", "")).startswith(_TAP_PREFIXES)
    }


def open_fds() -> set[tuple[int, str]]:
    """This process's open descriptors, each with what it points at, after a garbage
    collection: an object of an earlier test that only a collection closes (a socket in
    a reference cycle) is not this test's, and under pytest-xdist such leftovers closed
    while a test ran once made the count fall (26 before, 14 after)."""
    gc.collect()
    found = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone by now
            found.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
    return found


@dataclass(frozen=True)
class Residue:
    runtime_dir: Path
    qemu_pids: frozenset[int]
    run_dirs: tuple[str, ...]
    hugetlbfs: tuple[str, ...]
    hugepages_used: dict[int, int]
    taps: frozenset[str]
    relay_pids: frozenset[int]  # the agent relays (runtime/channels/agent_relay.py)

    @classmethod
    def take(cls, runtime_dir: Path) -> Residue:
        runs = sorted(p.name for p in runtime_dir.iterdir()) if runtime_dir.is_dir() else []
        if paths.FAILED_DIR in runs:  # a failed up's logs, kept on purpose: logs only
            runs.remove(paths.FAILED_DIR)
            kept = [p for p in (runtime_dir / paths.FAILED_DIR).rglob("*") if not p.is_dir()]
            runs += [str(p) for p in kept if p.name not in paths.KEPT_LOGS or not p.is_file()]
        return cls(
            runtime_dir=runtime_dir,
            qemu_pids=frozenset(qemu_pids_using(runtime_dir)),
            run_dirs=tuple(runs),
            hugetlbfs=tuple(hpcvm_hugetlbfs_entries(runtime_dir)),
            hugepages_used=hugepages_in_use(),
            taps=frozenset(tap_devices()),
            relay_pids=frozenset(relay_pids_using(runtime_dir)),
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
        extra = sum(
            (used - before.hugepages_used.get(size, 0)) * size
            for size, used in self.hugepages_used.items()
        )
        if extra > 0:
            # Other people's guests on this machine take huge pages too: only pages
            # that nobody else holds now count against this test.
            others = hugetlb_bytes_held_by_others(set(self.qemu_pids))
            if extra > others:
                problems.append(
                    f"{(extra - others) // 1024} kB more huge pages in use than before "
                    "(and not held by any other process or file)"
                )
        if self.relay_pids - before.relay_pids:
            problems.append(f"agent relays running: pids {sorted(self.relay_pids)}")
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


@contextlib.contextmanager
def isolated_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, down: Callable[[], object]
) -> Iterator[Path]:
    """A runtime directory of the test's own (guests given 180 s to answer); after the
    test ``down`` stops every VM in it, and nothing of theirs may be left."""
    root = tmp_path / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    monkeypatch.setenv("HPCVM_READY_TIMEOUT", "180")
    before = Residue.take(root)
    yield root
    down()
    assert_nothing_left(before)


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


def reserve_hugepages(count: int, size: int = PAGE_2M) -> None:
    """Make at least ``count`` pages of ``size`` free, only ever raising the pool (other
    people on this machine use huge pages too, so it is never lowered)."""
    pool = _SYS_HUGEPAGES / f"hugepages-{size // 1024}kB"
    total = int((pool / "nr_hugepages").read_text())
    free = int((pool / "free_hugepages").read_text())
    if free < count:
        (pool / "nr_hugepages").write_text(str(total + count - free))
    free = int((pool / "free_hugepages").read_text())
    assert free >= count, f"could reserve only {free} of {count} {size // 1024} kB huge pages"


HPCVM = str(Path(sys.executable).with_name("hpcvm"))


def hpcvm(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the installed ``hpcvm`` command as a user would, capturing its output."""
    return subprocess.run([HPCVM, *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single ``hpcvm: error:`` line of a refused command (and no traceback)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcvm: error:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def interruptible() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT (Ctrl-C): the default
    disposition, so that Python in the child turns it into KeyboardInterrupt. A test
    run started in the background by a shell without job control inherits SIGINT
    ignored, and hpcvm, as every well-behaved program, keeps an ignored SIGINT ignored
    (how shells protect background jobs from Ctrl-C): the signal would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
