"""Is KVM really usable? The ``--accel auto`` probe.

Host discovery already rules KVM out when it can tell (no /dev/kvm, no VT-x/AMD-V, a
paravirtual ``kvm_pvm`` module); an ordinary guest kernel then hangs rather than fails,
so this probe is never run there. Where discovery says KVM is usable, a tiny guest is
booted with ``-accel kvm`` and must reach a kernel panic (no root file system,
``panic=-1`` and ``-no-reboot`` make QEMU exit) within a short timeout; if it does not,
``auto`` falls back to TCG with a warning.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hpcvm.bootspec import SANDBOX
from hpcvm.render.qemu import opts
from hpcvm.runtime.hostside.confine import qemu_user

PROBE_TIMEOUT = 15.0
_MARKERS = ("Kernel panic", "VFS: Unable to mount root")
TCG_WARNING = (
    "running under TCG (software emulation): timings say nothing about hardware virtualization"
)


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    detail: str
    seconds: float


def pvm_loaded() -> bool:
    """True when the paravirtual kvm_pvm module serves /dev/kvm (ordinary guests hang)."""
    return Path("/sys/module/kvm_pvm").exists()


def hw_virt() -> bool:
    """True when the CPU flags show VT-x or AMD-V."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split()
    return "vmx" in flags or "svm" in flags


def probe_argv(kernel: str, serial_log: str, run_as: str | None = None) -> list[str]:
    """The probe guest: a kernel alone, which panics for want of a root and exits.
    Confined like every guest (render/qemu.py ``_confine``): as ``run_as`` once set up,
    under QEMU's seccomp sandbox."""
    confine = ["-runas", run_as] if run_as else []
    return [
        "qemu-system-x86_64",
        "-accel", "kvm",
        "-machine", "q35",
        "-cpu", "host",
        "-m", "256M",
        "-smp", "1",
        "-nodefaults",
        "-display", "none",
        "-no-reboot",
        "-serial", f"file:{serial_log}",
        "-kernel", kernel,
        "-append", "console=ttyS0 panic=-1 loglevel=4",
        "-sandbox", opts("on", *SANDBOX),
        *confine,
    ]  # fmt: skip


def probe_kvm(kernel: str, *, timeout: float = PROBE_TIMEOUT) -> ProbeResult:
    """Boot ``kernel`` on KVM until it panics; ok when it gets there within ``timeout``.

    Refuses to start anything on a PVM host or without VT-x/AMD-V, where an ordinary
    guest would hang at 100% CPU.
    """
    if pvm_loaded():
        return ProbeResult(False, "/dev/kvm is paravirtual KVM (kvm_pvm)", 0.0)
    if not hw_virt():
        return ProbeResult(False, "the CPU shows no VT-x/AMD-V", 0.0)
    user = qemu_user()
    begin = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hpcvm-kvm-probe-") as tmp:
        serial = Path(tmp) / "serial.log"
        proc = subprocess.Popen(
            probe_argv(kernel, str(serial), user.name if user.switch else None),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return ProbeResult(
                False, f"a guest kernel did not boot on KVM within {timeout:.0f} s", timeout
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        text = serial.read_text(errors="replace") if serial.exists() else ""
    seconds = time.monotonic() - begin
    if any(marker in text for marker in _MARKERS):
        return ProbeResult(True, "a guest kernel booted on KVM", seconds)
    return ProbeResult(
        False, f"the KVM probe guest exited with code {proc.returncode} before booting", seconds
    )
