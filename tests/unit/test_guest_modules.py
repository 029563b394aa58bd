"""Module load order from the real modules.dep of the distribution kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.errors import RuntimeFailure
from hpcvm.guest import kernel as kernels
from hpcvm.guest.modules import GUEST_MODULES, OPTIONAL_MODULES, ModuleIndex, module_name
from tests.guest_support import modules_dep_lines, unpacked_kernel


@pytest.fixture(scope="module")
def tree() -> kernels.KernelTree:
    return unpacked_kernel()


@pytest.fixture(scope="module")
def index(tree: kernels.KernelTree) -> ModuleIndex:
    return ModuleIndex.load(tree.modules_dir)


def test_guest_order_puts_every_dependency_first(
    tree: kernels.KernelTree, index: ModuleIndex
) -> None:
    order = index.load_order(GUEST_MODULES)
    deps = modules_dep_lines(tree)  # read without hpcvm's parser
    assert len(order) == len(set(order))
    for position, name in enumerate(order):
        needed = {d.replace("-", "_") for d in deps[name]}
        assert needed <= set(order[:position]), f"{name} loaded before {needed - set(order)}"
    # Everything asked for is loaded (none of them is built into Debian's kernel).
    assert set(GUEST_MODULES) <= set(order)


def test_order_matches_the_measured_9p_chain(index: ModuleIndex) -> None:
    """NOTES-guest.md: virtio_ring, virtio, virtio_pci_modern_dev, virtio_pci_legacy_dev,
    virtio_pci, netfs, fscache, 9pnet, 9pnet_virtio, 9p booted a 9p root here."""
    order = index.load_order(GUEST_MODULES)
    for before, after in [
        ("virtio_ring", "virtio"),
        ("virtio", "virtio_pci"),
        ("virtio_pci_modern_dev", "virtio_pci"),
        ("virtio_pci_legacy_dev", "virtio_pci"),
        ("netfs", "fscache"),
        ("fscache", "9p"),
        ("9pnet", "9pnet_virtio"),
        ("9pnet", "9p"),
        ("virtio", "virtio_console"),
    ]:
        assert order.index(before) < order.index(after), (before, after)


def test_one_module_brings_exactly_its_dependencies(
    tree: kernels.KernelTree, index: ModuleIndex
) -> None:
    expected = set(modules_dep_lines(tree)["9p"]) | {"9p"}
    order = index.load_order(["9p"])
    assert set(order) == expected
    assert order[-1] == "9p"


def test_dashes_and_underscores_name_the_same_module(index: ModuleIndex) -> None:
    assert index.load_order(["virtio-console"]) == index.load_order(["virtio_console"])


def test_builtin_modules_are_skipped(tree: kernels.KernelTree, index: ModuleIndex) -> None:
    builtin = (tree.modules_dir / "modules.builtin").read_text().split()[0]
    assert module_name(builtin) in index.builtin
    assert index.load_order([module_name(builtin)]) == []


def test_unknown_module_is_a_one_line_error(index: ModuleIndex) -> None:
    with pytest.raises(RuntimeFailure) as info:
        index.load_order(["no_such_module_xyz"])
    assert "no_such_module_xyz" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_cycle_is_reported_not_looped() -> None:
    # Hand-written text: no real kernel has a dependency cycle to test with.
    index = ModuleIndex.parse("kernel/a.ko: kernel/b.ko\nkernel/b.ko: kernel/a.ko\n")
    with pytest.raises(RuntimeFailure, match="cycle"):
        index.load_order(["a"])


def test_missing_modules_dep_names_depmod(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure, match="depmod"):
        ModuleIndex.load(tmp_path)


def test_optional_module_is_skipped_only_when_missing() -> None:
    index = ModuleIndex.parse("kernel/a.ko:\nkernel/b.ko: kernel/a.ko\n")
    optional = sorted(OPTIONAL_MODULES)
    assert index.load_order(["b", *optional]) == ["a", "b"]  # this kernel has none of them
    with pytest.raises(RuntimeFailure, match="no module zz"):
        index.load_order(["zz"])


def test_device_drivers_load_last_and_only_for_their_devices(
    tree: kernels.KernelTree, index: ModuleIndex
) -> None:
    """The /init plan: every guest's modules first, without patterns; each device driver
    and what only it needs after them, with that driver's PCI/virtio aliases as the
    kernel's modules.alias lists them (read here without hpcvm's parser)."""
    from hpcvm.guest.modules import DEVICE_MODULES

    listed: dict[str, set[str]] = {}
    for line in (tree.modules_dir / "modules.alias").read_text().splitlines():
        words = line.split()  # "alias PATTERN MODULE" (some ACPI/of patterns hold spaces)
        pattern, module = words[1], words[-1]
        if pattern.startswith(("pci:", "virtio:")):
            listed.setdefault(module.replace("-", "_"), set()).add(pattern)
    plan = index.load_plan(GUEST_MODULES)
    names = [name for name, _ in plan]
    assert sorted(names) == sorted(index.load_order(GUEST_MODULES))
    first_device = next(i for i, (_, patterns) in enumerate(plan) if patterns)
    assert all(patterns for _, patterns in plan[first_device:])
    always = {name for name, _ in plan[:first_device]}
    assert not always & DEVICE_MODULES and {"virtio_pci", "9p", "virtio_console"} <= always
    patterns = dict(plan)
    for device in DEVICE_MODULES & set(names):
        assert set(patterns[device]) == listed[device], device
    assert "virtio:d00000001v*" in patterns["virtio_net"]  # the virtio-net device id
    # failover is there only for virtio_net: it waits for a virtio NIC too
    assert set(patterns["failover"]) == set(patterns["net_failover"]) == listed["virtio_net"]
    deps = modules_dep_lines(tree)
    for position, name in enumerate(names):
        assert {d.replace("-", "_") for d in deps[name]} <= set(names[:position]), name


def test_a_device_module_without_aliases_is_refused() -> None:
    index = ModuleIndex.parse("kernel/a.ko:\nkernel/drivers/virtio_net.ko: kernel/a.ko\n")
    with pytest.raises(RuntimeFailure, match="virtio_net"):
        index.load_plan(["a", "virtio_net"])
