"""What runtime/vm/boot.py adds to a boot spec: QEMU's confinement per backend and an hpc
plan's guest kernel arguments (pure functions on the spec)."""

from __future__ import annotations

from hpcvm.bootspec import BootSpec
from hpcvm.guest.image import CMDLINE
from hpcvm.runtime.backends.registry import get_backend
from hpcvm.runtime.hostside.confine import QemuUser
from hpcvm.runtime.vm.boot import confined, with_guest_kernel_args

DROP = QemuUser("hpcvm-qemu", 999, 995, (995,), switch=True)
SAME = QemuUser("alice", 1000, 1000, (1000,), switch=False)
BUILTIN = BootSpec(kernel="/k", initrd="/i", cmdline=CMDLINE, share_table=True)


def test_qemu_backend_drops_to_its_user_and_sandboxes() -> None:
    qemu = get_backend("qemu").confines_itself
    assert confined(BUILTIN, qemu, DROP).run_as == "hpcvm-qemu"
    assert confined(BUILTIN, qemu, DROP).sandbox
    as_caller = confined(BUILTIN, qemu, SAME)
    assert as_caller.run_as is None and as_caller.sandbox  # already unprivileged


def test_libvirt_confines_qemu_itself() -> None:
    spec = confined(BUILTIN, get_backend("libvirt").confines_itself, DROP)
    assert spec.run_as is None and not spec.sandbox


def test_guest_kernel_args_are_appended_once() -> None:
    args = ("nohz_full=1", "rcu_nocbs=1", "clocksource=tsc")
    spec = with_guest_kernel_args(BUILTIN, args)
    assert spec.cmdline is not None
    assert spec.cmdline.split() == [*CMDLINE.split(), *args]
    assert with_guest_kernel_args(spec, args) == spec
    assert with_guest_kernel_args(BUILTIN, ()) == BUILTIN


def test_disk_image_keeps_its_own_command_line() -> None:
    disk = BootSpec(disk_image="/d.qcow2")
    assert with_guest_kernel_args(disk, ("clocksource=tsc",)) == disk
