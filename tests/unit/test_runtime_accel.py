"""The --accel auto KVM probe (runtime/accel.py) on this machine.

Here /dev/kvm is paravirtual (kvm_pvm): an ordinary guest hangs on it, so the probe must
refuse at once without starting QEMU.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpcvm.runtime import accel

PVM_HOST = Path("/sys/module/kvm_pvm").exists()


def test_pvm_detection_agrees_with_sysfs() -> None:
    assert accel.pvm_loaded() == PVM_HOST


@pytest.mark.skipif(not PVM_HOST, reason="only meaningful on a PVM host")
def test_probe_refuses_on_pvm_without_starting_qemu(tmp_path: Path) -> None:
    kernel = tmp_path / "vmlinuz"  # never read: the probe must stop before QEMU
    begin = time.monotonic()
    result = accel.probe_kvm(str(kernel), timeout=60.0)
    assert not result.ok and "kvm_pvm" in result.detail
    assert time.monotonic() - begin < 5.0  # not the 60 s timeout: nothing was started


def test_probe_command_is_kvm_with_a_panicking_kernel() -> None:
    argv = accel.probe_argv("/k", "/tmp/s.log")
    assert argv[argv.index("-accel") + 1] == "kvm"
    assert "-no-reboot" in argv and "panic=-1" in argv[argv.index("-append") + 1]
