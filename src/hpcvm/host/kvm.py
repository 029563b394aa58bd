"""Can this host run an ordinary KVM guest? Not the same as "/dev/kvm exists": a
paravirtual KVM (the kvm_pvm module, as on this project's machine) exposes /dev/kvm
without VT-x/AMD-V, and an ordinary guest kernel hangs on it. The planner and runtime
use ``usable`` to resolve ``--accel auto``; ``reason`` is what the user reads.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcvm.host.model import KvmInfo
from hpcvm.host.privilege import for_admin

HW_VIRT_FLAGS = frozenset({"vmx", "svm"})


def live_kvm(
    flags: frozenset[str], *, dev: Path = Path("/dev/kvm"), sys_root: Path = Path("/")
) -> KvmInfo:
    """Probe this host: the device node, whether it opens, the CPU flags and PVM."""
    device = dev.exists()
    opens = _opens(dev) if device else False
    hw_virt = bool(flags & HW_VIRT_FLAGS)
    pvm = (sys_root / "sys" / "module" / "kvm_pvm").exists()
    usable = device and opens and hw_virt and not pvm
    return KvmInfo(
        device=device,
        hw_virt=hw_virt,
        pvm=pvm,
        usable=usable,
        reason=_live_reason(device=device, opens=opens, hw_virt=hw_virt, pvm=pvm, dev=dev),
    )


def _opens(dev: Path) -> bool:
    try:
        fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def _live_reason(*, device: bool, opens: bool, hw_virt: bool, pvm: bool, dev: Path) -> str:
    if not device:
        return (
            f"{dev} does not exist: load kvm_intel or kvm_amd (and enable VT-x/AMD-V in "
            "the firmware); guests will run under TCG emulation"
        )
    if pvm:
        return (
            f"{dev} is a paravirtual KVM (kvm_pvm) without VT-x/AMD-V: ordinary guest "
            "kernels do not boot on it; guests will run under TCG emulation"
        )
    if not hw_virt:
        return (
            f"{dev} exists but the CPU shows no vmx/svm flag (nested virtualization off?): "
            "guests will run under TCG emulation"
        )
    if not opens:
        return (
            f"{dev} cannot be opened by this user: "
            + for_admin("add this user to the kvm group (then log in again)")
            + "; until then guests run under TCG emulation"
        )
    return f"{dev} opens and the CPU has hardware virtualization: guests can use KVM"


def snapshot_kvm(flags: frozenset[str] | None, *, source: str) -> KvmInfo:
    """A snapshot or XML file records no /dev and no loaded modules: KVM is never
    positively known, so it is not ``usable`` (``--accel auto`` plans TCG), but a plan
    for that machine may ask for KVM (``--accel kvm``) unless the recorded CPU flags
    show no VT-x/AMD-V. An XML file records no flags at all: ``hw_virt`` is None."""
    if flags is None:
        what, hw_virt = "no CPU flags are recorded", None
    elif flags & HW_VIRT_FLAGS:
        what, hw_virt = "the CPU flags show VT-x/AMD-V", True
    else:
        what, hw_virt = "the CPU flags show no VT-x/AMD-V", False
    then = (
        "--accel kvm is refused for it"
        if hw_virt is False
        else "--accel auto plans TCG; --accel kvm plans KVM for it"
    )
    return KvmInfo(
        device=None,
        hw_virt=hw_virt,
        pvm=False,
        usable=False,
        reason=f"cannot tell from {source} whether /dev/kvm exists or works ({what}); {then}",
    )
