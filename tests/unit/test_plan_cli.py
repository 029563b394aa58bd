"""`hpcvm plan` as a user runs it: a real process, real snapshots, exit codes, one-line
errors without traceback, JSON that round-trips into VMPlan."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpcvm.host import discover
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest, VMPlan
from hpcvm.units import GIB
from tests.conftest import sysfs_root

SNAPSHOT = "40intel64-2g2n4c+pci"


@pytest.fixture(scope="module")
def root(snapshots_dir: Path) -> Path:
    return sysfs_root(snapshots_dir, SNAPSHOT)


def hpcvm(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400"}  # rich: one table row per line
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "plan", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def _one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hpcvm: error: ")
    assert result.stdout == ""
    return lines[0]


def test_json_round_trips_into_the_same_plan(root: Path) -> None:
    result = hpcvm(
        "--profile", "numa", "--vcpus", "12", "--memory", "2G", "--page-size", "4K",
        "--name", "job1", "--sysfs-root", root, "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    parsed = VMPlan.model_validate_json(result.stdout)
    assert parsed.model_dump_json(indent=2) == result.stdout.strip()
    request = PlanRequest(
        name="job1", profile="numa", vcpus=12, memory_bytes=2 * GIB, page_size_bytes=4096
    )
    assert parsed == plan(discover(sysfs_root=root), request)
    assert parsed.name == "job1" and len(parsed.guest_nodes) == 2


def test_table_shows_every_decision_and_pin(root: Path) -> None:
    args = ["--profile", "hpc", "--vcpus", "6", "--memory", "1G", "--page-size", "4K"]
    table = hpcvm(*args, "--sysfs-root", root)
    assert table.returncode == 0, table.stderr
    data = VMPlan.model_validate_json(hpcvm(*args, "--sysfs-root", root, "--format", "json").stdout)
    for section in ("vCPUs", "Guest NUMA nodes", "Memory backing", "QEMU's own threads",
                    "Recommendations", "Warnings", "Decisions"):  # fmt: skip
        assert section in table.stdout
    for decision in data.decisions:
        assert decision.text in table.stdout
    rows = {
        tuple(cell.strip() for cell in line.split("│")[1:-1])
        for line in table.stdout.splitlines()
        if line.startswith("│")
    }
    for p in data.placements:
        cells = (p.vcpu, p.socket, p.core, p.thread, p.guest_node, p.host_pu)
        assert (*map(str, cells), "0") in rows, f"vCPU {p.vcpu} row"  # on host node 0


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--profile", "numa", "--vcpus", "2", "--memory", "2X"], 2, "malformed --memory"),
        (["--profile", "numa", "--vcpus", "2", "--memory", "0"], 2, "must be positive"),
        (["--profile", "numa", "--vcpus", "0", "--memory", "1G"], 2, "--vcpus must be"),
        (["--profile", "pinned", "--vcpus", "2", "--memory", "1G", "--page-size", "2M"], 2,
         "--profile hugepages"),
        (["--profile", "hpc", "--vcpus", "2", "--memory", "1G", "--passthrough", "99:00.0"], 2,
         "0000:99:00.0 is not on this host"),
        (["--profile", "pinned", "--vcpus", "41", "--memory", "1G"], 3, "only 40 PUs"),
        (["--profile", "numa", "--vcpus", "2", "--memory", "1G"], 3, "echo 512 > "),
        (["--profile", "naive", "--vcpus", "2", "--memory", "4T"], 3, "more than this host's"),
        (["--profile", "naive", "--vcpus", "2", "--memory", "1G", "--smt", "pack"], 2,
         "--smt applies to pinned profiles"),
    ],
)  # fmt: skip
def test_refusals_exit_with_their_code_in_one_line(
    root: Path, args: list[str], code: int, words: str
) -> None:
    line = _one_error_line(hpcvm(*args, "--sysfs-root", root), code)
    assert words in line


def test_unreadable_topology_is_a_topology_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.xml"
    line = _one_error_line(
        hpcvm("--profile", "naive", "--vcpus", "1", "--memory", "1G", "--topology", missing), 4
    )
    assert str(missing) in line


def test_qemu_and_libvirt_formats(root: Path) -> None:
    args = ["--profile", "numa", "--vcpus", "4", "--memory", "1G", "--page-size", "4K",
            "--sysfs-root", str(root)]  # fmt: skip
    qemu = hpcvm(*args, "--format", "qemu")
    assert qemu.returncode == 0, qemu.stderr
    commands = [ln for ln in qemu.stdout.splitlines() if not ln.startswith("# ")]
    assert len(commands) == 1 and commands[0].startswith("qemu-system-x86_64 ")
    assert "TCG" in qemu.stderr, "warnings go to stderr, the command line alone to stdout"
    libvirt = hpcvm(*args, "--format", "libvirt")
    assert libvirt.returncode == 0, libvirt.stderr
    assert ET.fromstring(libvirt.stdout).tag == "domain"


def test_the_table_shows_the_guests_share_list(root: Path, tmp_path: Path) -> None:
    """What a built-in guest would see: the share given (at its host path, read-write
    as asked) and the system directories, never /root or /home; a bad --share is one
    line with exit 2 and no table."""
    shared = tmp_path / "inputs"
    shared.mkdir()
    base = ("--profile", "naive", "--vcpus", "1", "--memory", "1G", "--sysfs-root", root)
    result = hpcvm(*base, "--share", f"{shared}:rw")
    assert result.returncode == 0, result.stderr
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("guest sees: ")]
    seen = line.removeprefix("guest sees: ").split("; ")
    assert f"{shared} (rw)" in seen and "/usr (ro)" in seen
    assert not any(s.startswith(("/root", "/home", "/var")) for s in seen)
    bad = hpcvm(*base, "--share", "relative/dir")
    assert "relative" in _one_error_line(bad, 2) and bad.stdout == ""
