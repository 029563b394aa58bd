"""The --accel auto KVM probe (runtime/hostside/accel.py) on this machine.

Here /dev/kvm is paravirtual (kvm_pvm): an ordinary guest hangs on it, so the probe must
refuse at once without starting QEMU.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpcvm.runtime.hostside import accel

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
    assert argv[argv.index("-sandbox") + 1].startswith("on,") and "-runas" not in argv
    confined = accel.probe_argv("/k", "/tmp/s.log", "hpcvm-qemu")
    assert confined[confined.index("-runas") + 1] == "hpcvm-qemu"


@pytest.mark.skipif(not PVM_HOST, reason="only meaningful on a PVM host")
def test_auto_falls_back_to_tcg_when_the_probe_fails(tmp_path: Path) -> None:
    """A host whose discovery says KVM is usable cannot exist here, so this host's real
    topology is given a usable KvmInfo (a stand-in): the planner then picks KVM, the
    probe refuses at once (kvm_pvm), and make_plan re-plans for TCG with a warning."""
    from hpcvm.host import discover
    from hpcvm.host.model import KvmInfo
    from hpcvm.plan.model import PlanRequest
    from hpcvm.runtime.machine.planning import make_plan

    real = discover()
    kvm_host = real.model_copy(
        update={"kvm": KvmInfo(device=True, hw_virt=True, usable=True, reason="stand-in")}
    )
    warnings: list[str] = []
    request = PlanRequest(profile="naive", vcpus=1, memory_bytes=256 << 20, accel="auto")
    begin = time.monotonic()
    plan = make_plan(request, host=kvm_host, kernel=str(tmp_path / "k"), warn=warnings.append)
    assert plan.accel == "tcg"
    assert len(warnings) == 1 and "KVM probe failed" in warnings[0]
    assert time.monotonic() - begin < 10.0
