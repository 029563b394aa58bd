"""The variant checks (runtime/verify/variant.py) on text captured from this machine's
QEMU 7.2 and kernel: ``info ramblock`` of a vm:hpc+page=4K guest, an smaps excerpt of
its QEMU, a guest's THP file and NIC listing. The expected values are read off the
captured text by eye and written here; each check must also fail when the text says
otherwise."""

from __future__ import annotations

from hpcvm.bench.envs.variants import VmVariant
from hpcvm.bench.envs.vm import plan_vm
from hpcvm.bootspec import Nic
from hpcvm.host import synthetic
from hpcvm.plan.model import VMPlan
from hpcvm.runtime.verify.variant import (
    RamBlock,
    SmapsEntry,
    VariantSeen,
    check_guest_thp,
    check_nic_drivers,
    check_pages,
    facts,
    parse_guest,
    parse_ramblocks,
    parse_smaps,
    parse_thp,
)
from hpcvm.units import MIB

# captured lines, their leading padding cut (the parser splits on whitespace)
RAMBLOCK = """Block Name    PSize              Offset               Used              Total
      mem0    4 KiB  0x0000000000000000 0x0000000010000000 0x0000000010000000
/rom@etc/acpi/tables    4 KiB  0x0000000010080000 0x0000000000020000 0x0000000000200000
   pc.bios    4 KiB  0x0000000010000000 0x0000000000040000 0x0000000000040000
"""
SMAPS = """7f86cfe00000-7f86dfe00000 rw-p 00000000 00:00 0
Size:             262144 kB
KernelPageSize:        4 kB
MMUPageSize:           4 kB
AnonHugePages:    262144 kB
7f86e0000000-7f871ffff000 rwxp 00000000 00:00 0
Size:            1048572 kB
KernelPageSize:        4 kB
AnonHugePages:     79872 kB
7f8800000000-7f8810000000 rw-s 00000000 00:2d 12 /dev/hugepages/vm-x/qemu_back_mem.mem0
Size:             262144 kB
KernelPageSize:     2048 kB
AnonHugePages:         0 kB
"""
GUEST = """always madvise [never]
@@nics@@
52:54:00:aa:bb:01 e1000
"""


def _nic(model: str, mac: str = "52:54:00:aa:bb:01") -> Nic:
    return Nic.model_validate(
        {
            "kind": "bridge",
            "source": "br0",
            "model": model,
            "mac": mac,
            "ifname": "hv0",
            "mtu": 1500,
        }
    )


def test_parsers_read_what_qemu_and_the_kernels_printed() -> None:
    assert parse_thp("always [madvise] never") == "madvise"
    assert parse_guest(GUEST) == ("never", {"52:54:00:aa:bb:01": "e1000"})
    blocks = parse_ramblocks(RAMBLOCK)
    assert blocks["mem0"] == RamBlock("mem0", 4096)
    assert blocks["/rom@etc/acpi/tables"].page_size == 4096
    maps = parse_smaps(SMAPS)
    assert [(m.size, m.kernel_page, m.anon_huge) for m in maps] == [
        (256 * MIB, 4096, 256 * MIB),
        (1048572 * 1024, 4096, 79872 * 1024),
        (256 * MIB, 2 * MIB, 0),
    ]
    assert maps[2].path == "/dev/hugepages/vm-x/qemu_back_mem.mem0"


def test_thp_and_nic_checks_fail_on_what_differs() -> None:
    seen = VariantSeen(guest_thp="never", nic_drivers={"52:54:00:aa:bb:01": "e1000"})
    assert [c.ok for c in check_guest_thp("never", seen)] == [True]
    assert [c.ok for c in check_guest_thp("always", seen)] == [False]
    assert check_guest_thp(None, seen) == []
    assert [c.ok for c in check_nic_drivers([_nic("e1000")], seen)] == [True]
    virtio = check_nic_drivers([_nic("virtio")], seen)
    assert [(c.ok, c.expected, c.actual) for c in virtio] == [(False, "virtio_net", "e1000")]
    missing = check_nic_drivers([_nic("e1000", mac="52:54:00:aa:bb:02")], seen)
    assert not missing[0].ok


def _plan(page: int) -> VMPlan:
    host = synthetic("node:1 core:2 pu:1")
    return plan_vm("hpc", vcpus=1, memory_bytes=256 * MIB, host=host, variant=VmVariant(page=page))[
        0
    ]


def test_a_4k_backend_must_sit_on_4k_pages_without_thp() -> None:
    plan = _plan(4096)
    memdevs = {"mem0": {"size": 256 * MIB, "host-nodes": [0], "policy": "bind"}}
    blocks = parse_ramblocks(RAMBLOCK)
    thp_backed = VariantSeen(
        guest_thp="always", ramblocks=blocks, memdevs=memdevs, smaps=tuple(parse_smaps(SMAPS))
    )
    checks = check_pages(plan, thp_backed)
    failed = {c.name for c in checks if not c.ok}
    assert failed == {"mem0 on host THP (kernel smaps)"}  # the captured QEMU had THP on
    clean = (SmapsEntry(0x1000, 256 * MIB, 4096, 0),)
    seen = VariantSeen(guest_thp="always", ramblocks=blocks, memdevs=memdevs, smaps=clean)
    assert all(c.ok for c in check_pages(plan, seen))
    assert facts(plan, seen) == {
        "guest_thp": "always",
        "host_page": "4K",
        "guest_ram_on_host_thp": "0",
    }
    wrong_nodes = {"mem0": {"size": 256 * MIB, "host-nodes": [1], "policy": "bind"}}
    moved = VariantSeen(guest_thp="always", ramblocks=blocks, memdevs=wrong_nodes, smaps=clean)
    assert [c.name for c in check_pages(plan, moved) if not c.ok] == [
        "mem0 backend (QMP query-memdev)"
    ]
