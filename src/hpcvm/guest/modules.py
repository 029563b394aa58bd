"""Which kernel modules the built-in guest loads, and in what order.

The initramfs has no modprobe and no udev: its /init loads a fixed list with busybox
``insmod``, so dependencies must be resolved when the image is built. They come from the
kernel's own ``modules.dep`` (written by ``depmod``), never from a list kept by hand,
so a kernel that splits or merges modules still gets a correct order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hpcvm.errors import RuntimeFailure
from hpcvm.nic_models import NIC_MODELS

# What the guest needs, in the order a person would load them; dependencies are added
# before the module that needs them. virtio-pci carries every device; 9p shares the
# host's directories; virtio_console carries the guest agent; overlay makes read-only
# shares writable in the guest; qemu_fw_cfg reads the share table hpcvm passes on
# fw_cfg; virtio_blk is for user disk images; then what each NIC model of ``--network``
# needs (nic_models.py: virtio_net, with net_failover and failover from modules.dep, for
# the paravirtual one, e1000 for the emulated one the studies compare it with, and a
# plugin's, registered before this module is imported); iavf and ixgbevf drive the SR-IOV VFs
# of Intel NICs (``--network vf=``), optional (OPTIONAL_MODULES): a kernel without them
# still boots, only without VF networking. NUMA and hugetlbfs are built into distribution
# kernels (checked by kernel.check_config), so no module is needed for them.
# each once, in the order the models were registered: models sharing a driver add nothing
NIC_MODULES = tuple(dict.fromkeys(m for spec in NIC_MODELS.values() for m in spec.guest_modules))
GUEST_MODULES: tuple[str, ...] = (
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
    "virtio_console",
    "overlay",
    "qemu_fw_cfg",
    "virtio_blk",
    *NIC_MODULES,
    "iavf",
    "ixgbevf",
)
OPTIONAL_MODULES = frozenset({"iavf", "ixgbevf"})  # loaded when the kernel has them
# Drivers of devices a VM may or may not have (a disk, a NIC): the guest's /init loads
# one (and what only it needs) when a device on the PCI or virtio bus matches one of its
# aliases from the kernel's modules.alias, as udev would; a VM without NICs spends no
# insmod on them (under TCG, each costs some 20 to 60 ms). Listed last in GUEST_MODULES.
DEVICE_MODULES = frozenset({"virtio_blk", *NIC_MODULES, "iavf", "ixgbevf"})
ALIAS_BUSES = ("pci:", "virtio:")  # the buses /init reads device aliases from

_SUFFIXES = (".ko", ".ko.xz", ".ko.gz", ".ko.zst")


def module_name(path: str) -> str:
    """``kernel/fs/9p/9p.ko.xz`` -> ``9p``; dashes and underscores are the same to the
    kernel, so names are normalised to underscores."""
    base = path.rsplit("/", 1)[-1]
    for suffix in _SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


@dataclass(frozen=True)
class ModuleIndex:
    """``modules.dep`` and ``modules.builtin`` of one kernel, keyed by module name."""

    paths: dict[str, str]  # name -> path relative to the modules directory
    depends: dict[str, tuple[str, ...]]  # name -> names it needs
    builtin: frozenset[str]
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # PCI/virtio patterns

    @classmethod
    def parse(cls, dep_text: str, builtin_text: str = "", alias_text: str = "") -> ModuleIndex:
        """Read the text of ``modules.dep`` (``path: dep-path dep-path ...``)."""
        paths: dict[str, str] = {}
        depends: dict[str, tuple[str, ...]] = {}
        for lineno, line in enumerate(dep_text.splitlines(), 1):
            if not line.strip():
                continue
            target, sep, rest = line.partition(":")
            if not sep:
                raise RuntimeFailure(f"modules.dep line {lineno} has no ':': {line[:80]!r}")
            name = module_name(target.strip())
            paths[name] = target.strip()
            depends[name] = tuple(module_name(p) for p in rest.split())
        builtin = frozenset(module_name(p) for p in builtin_text.split())
        aliases: dict[str, list[str]] = {}
        for line in alias_text.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] == "alias" and words[1].startswith(ALIAS_BUSES):
                aliases.setdefault(module_name(words[2]), []).append(words[1])
        return cls(paths, depends, builtin, {k: tuple(v) for k, v in aliases.items()})

    @classmethod
    def load(cls, modules_dir: Path) -> ModuleIndex:
        """Read ``modules.dep`` (and ``modules.builtin`` if present) from a
        ``/lib/modules/<release>`` directory."""
        dep = modules_dir / "modules.dep"
        builtin = modules_dir / "modules.builtin"
        try:
            dep_text = dep.read_text()
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot read {dep} ({exc.strerror}): run `depmod -b ROOT RELEASE` first"
            ) from exc
        builtin_text = builtin.read_text() if builtin.is_file() else ""
        alias = modules_dir / "modules.alias"
        alias_text = alias.read_text() if alias.is_file() else ""
        return cls.parse(dep_text, builtin_text, alias_text)

    def load_order(self, wanted: tuple[str, ...] | list[str]) -> list[str]:
        """Module names to insmod, each after everything it depends on.

        Built-in modules are skipped (they are already in the kernel), and so are
        optional ones (OPTIONAL_MODULES) the kernel lacks. Any other wanted module
        the kernel has neither as a module nor built in is an error: the guest would
        fail at boot, later and less clearly.
        """
        order: list[str] = []
        done: set[str] = set()

        def visit(name: str, chain: tuple[str, ...]) -> None:
            if name in done:
                return
            if name in chain:
                raise RuntimeFailure(f"modules.dep has a cycle: {' -> '.join((*chain, name))}")
            for dep in self.depends[name]:
                if dep not in self.paths:
                    raise RuntimeFailure(f"modules.dep: {name} needs {dep}, which is not listed")
                visit(dep, (*chain, name))
            done.add(name)
            order.append(name)

        for raw in wanted:
            name = raw.replace("-", "_")
            if name in self.paths:
                visit(name, ())
            elif name not in self.builtin and name not in OPTIONAL_MODULES:
                raise RuntimeFailure(
                    f"this kernel has no module {name} (neither in modules.dep nor built in); "
                    "use a distribution kernel or pass one that has it with --kernel"
                )
        return order

    def load_plan(self, wanted: tuple[str, ...] | list[str]) -> list[tuple[str, tuple[str, ...]]]:
        """``load_order(wanted)`` split for /init: (name, device alias patterns) with the
        modules every guest loads first (no patterns), then each device module and the
        dependencies only it needs, with the patterns of the devices they serve (the
        union, for a dependency several of them share). A device module without any
        PCI or virtio alias could never be loaded: that is an error here."""
        always = set(self.load_order([m for m in wanted if m not in DEVICE_MODULES]))
        plan: list[tuple[str, tuple[str, ...]]] = [
            (name, ()) for name in self.load_order(wanted) if name in always
        ]
        serving: dict[str, list[str]] = {}
        for device in (m for m in wanted if m in DEVICE_MODULES and m in self.paths):
            patterns = self.aliases.get(device, ())
            if not patterns:
                raise RuntimeFailure(
                    f"modules.alias names no PCI or virtio device for {device}: the guest "
                    "could not tell when to load it"
                )
            for name in self.load_order([device]):
                if name not in always:
                    serving.setdefault(name, []).extend(patterns)
        plan += [
            (name, tuple(dict.fromkeys(serving[name])))
            for name in self.load_order(wanted)
            if name in serving
        ]
        return plan
