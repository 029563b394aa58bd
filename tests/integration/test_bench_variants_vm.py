"""A VM variant is what its environment claims, checked in the running VM from sources
independent of hpcvm's checks: QEMU's own answers over QMP (asked here with qemu.qmp's
client directly), the kernel's /proc/PID/smaps of QEMU (parsed here), and the guest's
/sys read through the guest agent.

One boot for the module: ``vm:hpc+page=4K+thp=never``, 1 vCPU, 640 MiB (the least a
Linux guest keeps THP modes at: below 512 MiB of usable RAM it turns them off whatever
its command line says). Its host pages must be 4K all through (no transparent huge page
under its RAM either), its guest THP ``never``. Then the same VM checked against a
variant it is not (``thp=always``) must be refused, naming what differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from qemu.qmp import QMPClient

from hpcvm.bench.envs.kinds import parse_env
from hpcvm.bench.envs.variants import VmVariant
from hpcvm.bench.envs.vm import VmEnvironment, plan_vm, verify_variant
from hpcvm.errors import VerificationFailed
from hpcvm.runtime.backends.registry import get_backend
from hpcvm.units import MIB

pytestmark = pytest.mark.integration

NAME = "vm:hpc+page=4K+thp=never"
MEMORY = 640 * MIB


@pytest.fixture(scope="module")
def vm(guest: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmEnvironment]:
    choice = parse_env(NAME)
    assert choice.profile is not None
    plan, _ = plan_vm(choice.profile, vcpus=1, memory_bytes=MEMORY, variant=choice.variant)
    env = VmEnvironment(plan, vm_name="t-variant-4k-never", name=NAME, variant=choice.variant)
    env.start()  # verifies the variant itself; the tests look again, on their own
    get_backend("qemu").resume(env.machine)  # type: ignore[arg-type]
    try:
        yield env
    finally:
        env.close()


async def _hmp(socket: str, line: str) -> str:
    client = QMPClient("test")
    await client.connect(socket)
    try:
        return str(await client.execute("human-monitor-command", {"command-line": line}))
    finally:
        await client.disconnect()


def test_qemu_backs_guest_ram_with_4k_pages(vm: VmEnvironment) -> None:
    machine = vm.machine
    assert machine is not None and machine.boot.qmp_socket
    text = asyncio.run(_hmp(machine.boot.qmp_socket, "info ramblock"))
    blocks = {line.split()[0]: " ".join(line.split()[1:3]) for line in text.splitlines()[1:]}
    assert blocks["mem0"] == "4 KiB", text


def test_the_kernel_maps_it_with_4k_pages_and_no_thp(vm: VmEnvironment) -> None:
    """The anonymous mapping of exactly the guest's RAM, in QEMU's smaps."""
    machine = vm.machine
    assert machine is not None
    entries: list[dict[str, str]] = []
    for line in Path(f"/proc/{machine.pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            low, high = (int(x, 16) for x in head[0].split("-"))
            entries.append({"size": str(high - low), "path": " ".join(head[5:])})
        elif head and head[0].endswith(":"):
            entries[-1][head[0][:-1]] = head[1]
    ram = [e for e in entries if e["size"] == str(MEMORY) and not e["path"]]
    assert len(ram) == 1, [e for e in entries if int(e["size"]) >= 64 * MIB]
    assert ram[0]["KernelPageSize"] == "4" and ram[0]["AnonHugePages"] == "0", ram[0]


def test_the_guest_runs_with_thp_never(vm: VmEnvironment) -> None:
    assert vm.sampler is not None
    got = vm.sampler.exec(["/bin/cat", "/sys/kernel/mm/transparent_hugepage/enabled"])
    assert got.exit_code == 0 and "[never]" in got.stdout, got


def test_a_variant_it_is_not_is_refused_naming_the_difference(vm: VmEnvironment) -> None:
    assert vm.sampler is not None
    with pytest.raises(VerificationFailed) as info:
        verify_variant("vm:hpc+thp=always", vm.sampler, VmVariant(thp="always"))
    said = info.value.message
    assert said.startswith("vm:hpc+thp=always is not what it claims after boot")
    assert "guest THP mode: expected always, found never" in said and "\n" not in said


def test_what_it_records_is_what_was_observed(vm: VmEnvironment) -> None:
    described = vm.describe()
    assert described.name == NAME and described.variant == {"page": 4096, "thp": "never"}
    assert described.versions["host_page"] == "4K"
    assert described.versions["guest_thp"] == "never"
    assert described.versions["guest_ram_on_host_thp"] == "0"
