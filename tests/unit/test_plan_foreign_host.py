"""Planning for another machine (`--topology`, `--sysfs-root`): what the description
cannot tell is said to be unknown, never stated as a fact, and `--accel kvm` plans KVM
unless the description itself shows the CPU cannot do it.

The oracle is the description's own text: the hwloc XML records no CPU flags, and a
snapshot's /proc/cpuinfo says whether vmx or svm is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hpcvm.host import discover
from tests.conftest import TOPOLOGIES, sysfs_root

XML = TOPOLOGIES / "xml" / "16amd64-4distances.xml"
WITH_VMX = "40intel64-2g2n4c+pci"  # its cpuinfo lists vmx
WITHOUT_VT = "16amd64-8n2c"  # Opteron 865: its cpuinfo lists neither vmx nor svm
ARGS = ("--profile", "hpc", "--vcpus", "2", "--memory", "1G", "--page-size", "4K")


def hpcvm(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "400"},
        check=False,
    )


def _cpu_flags(root: Path) -> set[str]:
    lines = (root / "proc" / "cpuinfo").read_text().splitlines()
    return set(next(ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")))


def test_xml_records_no_cpu_flags_so_the_vt_question_is_open() -> None:
    assert '<info name="flags"' not in XML.read_text()  # hwloc XML: no CPU flags
    kvm = discover(xml=XML).kvm
    assert kvm.device is None and kvm.hw_virt is None and not kvm.usable
    shown = hpcvm("host", "--topology", XML)
    assert shown.returncode == 0, shown.stderr
    (row,) = [ln for ln in shown.stdout.splitlines() if "KVM" in ln]
    assert "no VT-x/AMD-V" not in row and "unknown" in row


def test_kvm_plan_for_an_xml_topology(tmp_path: Path) -> None:
    done = hpcvm("plan", *ARGS, "--accel", "kvm", "--topology", XML, "--format", "json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["accel"] == "kvm" and plan["cpu"]["model"] == "host"
    assert any("check that /dev/kvm" in w for w in plan["warnings"])  # assumed, and said
    auto = hpcvm("plan", *ARGS, "--topology", XML, "--format", "json")
    assert json.loads(auto.stdout)["accel"] == "tcg"  # auto never assumes


def test_kvm_plan_for_a_snapshot_whose_cpu_has_vt(snapshots_dir: Path) -> None:
    root = sysfs_root(snapshots_dir, WITH_VMX)
    assert _cpu_flags(root) & {"vmx", "svm"}
    done = hpcvm("plan", *ARGS, "--accel", "kvm", "--sysfs-root", root, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["accel"] == "kvm"


def test_kvm_refused_where_the_snapshot_shows_no_vt(snapshots_dir: Path) -> None:
    root = sysfs_root(snapshots_dir, WITHOUT_VT)
    assert not _cpu_flags(root) & {"vmx", "svm"}
    done = hpcvm("plan", *ARGS, "--accel", "kvm", "--sysfs-root", root)
    assert done.returncode == 3
    assert "no VT-x/AMD-V" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    shown = hpcvm("host", "--sysfs-root", root)
    (row,) = [ln for ln in shown.stdout.splitlines() if "KVM" in ln]
    assert "no VT-x/AMD-V" in row
