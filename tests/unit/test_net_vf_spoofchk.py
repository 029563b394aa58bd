"""A VF's MAC and spoof check (runtime/net/vf.py): no SR-IOV NIC exists on the machines hpcvm is
tested on, so the VF is the fake sysfs tree of test_network.py, whose PF interface is
``lo``; the command is run for real, and the oracle is who refuses it: the kernel (lo
has no VFs), not iproute2's parser, which names a word it does not take."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcvm.bootspec import Nic
from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.net import vf as net_vf
from hpcvm.runtime.net.base import mac_for
from tests.unit.test_network import _fake_sysfs


def test_a_vf_gets_its_mac_and_spoof_check_in_one_command(tmp_path: Path) -> None:
    kind = net_vf.VfKind(_fake_sysfs(tmp_path))
    nic = Nic(kind="vf", source="0000:01:00.3", model="vfio", mac=mac_for("j"), ifname="lo",
              mtu=1500)  # fmt: skip
    with pytest.raises(RuntimeFailure) as failed:
        kind.attach(nic)  # VF index 1 of the fake PF, whose interface is lo
    words = f"ip link set dev lo vf 1 mac {nic.mac} spoofchk on"
    assert f"`{words}` failed:" in str(failed.value)
    assert "RTNETLINK answers" in str(failed.value)  # the kernel's answer: parsed whole
    # the parser's answer for a word it does not know, so the oracle can tell them apart
    typo = subprocess.run([*words.replace("spoofchk", "spoofcheck").split()],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert typo.returncode != 0 and "RTNETLINK" not in typo.stderr
