"""`hpcvm plan` where a new user tripped (issue 23): names `up` would refuse, absurd
sizes, the huge page command cut at 80 columns, a QEMU line that hides what it leaves
out, SMT siblings without the vCPU count that fits on whole cores, and the exit code of
a page size the host does not offer.

Expected values come from the snapshots' own files (hwloc's XML for cores, the plan's
JSON for the lines the table must show whole), never from the table under test.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from hpcvm.cli.plan_view import print_plan
from hpcvm.errors import UsageError
from hpcvm.host import discover
from hpcvm.plan import plan
from hpcvm.plan.model import PlanRequest
from hpcvm.runtime.hostside.paths import check_name
from hpcvm.units import GIB, parse_size
from tests.conftest import TOPOLOGIES, sysfs_root
from tests.plan_checks import roomy

SMT_XML = TOPOLOGIES / "xml" / "32em64t-2n8c2t-pci-normalio.xml"  # 2 nodes x 8 cores x 2
NO_POOLS = "2amd64-2n"  # records neither huge page pools nor CPU flags


def hpcvm(*args: str | Path, columns: str | None = "400") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "plan", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def one_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcvm: error: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    return lines[0]


# -- item 10: plan refuses the names up refuses ----------------------------------------


@pytest.mark.parametrize("name", ["../evil", "a/b", "-x", "", "x" * 64, "sp ace", "job\n"])
def test_names_up_refuses_are_refused_by_plan(name: str) -> None:
    with pytest.raises(Exception, match="invalid VM name"):
        check_name(name)  # the runtime's rule, which `up` applies
    args = ("--profile", "naive", "--vcpus", "1", "--memory", "1G", "--topology", SMT_XML)
    line = one_error(hpcvm(*args, "--name", name, "--format", "libvirt"), 2)
    assert "invalid VM name" in line


def test_a_name_up_accepts_is_rendered() -> None:
    args = ("--profile", "naive", "--vcpus", "1", "--memory", "1G", "--topology", SMT_XML)
    done = hpcvm(*args, "--name", "job_1.a-b", "--format", "libvirt")
    assert done.returncode == 0, done.stderr
    assert ET.fromstring(done.stdout).findtext("name") == "job_1.a-b"


# -- item 15: absurd sizes are refused before any arithmetic ---------------------------


@pytest.mark.parametrize("size", ["99999999999999999999G", "5000T", "4097T", "4096.5T"])
def test_absurd_memory_is_a_usage_error(size: str) -> None:
    line = one_error(hpcvm("--profile", "naive", "--vcpus", "1", "--memory", size), 2)
    assert "--memory" in line and "4096T" in line


def test_sizes_are_exact_not_floats() -> None:
    assert parse_size("1.5G") == 3 * GIB // 2
    assert parse_size("4096T") == 2**52
    with pytest.raises(UsageError, match="not a whole number of bytes"):
        parse_size("1.00000000000000001G")  # a float rounds this to exactly 1G


# -- item 12: a page size the host does not offer is the host's limit (exit 3) ---------


def test_host_without_huge_pages_is_exit_3(snapshots_dir: Path) -> None:
    root = sysfs_root(snapshots_dir, NO_POOLS)
    hugepages = root / "sys" / "devices" / "system" / "node" / "node0" / "hugepages"
    assert not hugepages.exists()
    line = one_error(
        hpcvm("--profile", "numa", "--vcpus", "1", "--memory", "1G", "--sysfs-root", root), 3
    )
    assert "offers no 2M huge pages" in line and "--page-size 4K" in line


# -- item 6: commands the table tells the user to run are never cut -------------------


def test_recommended_commands_are_whole_at_80_columns(snapshots_dir: Path) -> None:
    host = roomy(discover(sysfs_root=sysfs_root(snapshots_dir, "40intel64-2g2n4c+pci")))
    vm = plan(host, PlanRequest(profile="hpc", vcpus=4, memory_bytes=2 * GIB))
    echoes = [line for line in vm.host_tuning if line.startswith("echo ")]
    assert echoes and max(map(len, echoes)) > 80
    out = io.StringIO()
    print_plan(vm, Console(file=out, width=80, color_system=None), host)
    printed = out.getvalue().splitlines()
    for line in vm.host_tuning:
        command = line.split("  # ")[0].split(" # ")[0]
        assert any(command in shown for shown in printed), f"{command!r} cut or wrapped"


# -- item 13: SMT siblings: the vCPU count that fits on whole cores --------------------


def _xml_cores() -> dict[int, int]:
    """PU os_index -> an id of its core, from hwloc's XML itself."""
    core_of: dict[int, int] = {}
    for index, core in enumerate(ET.parse(SMT_XML).iter("object")):
        if core.get("type") != "Core":
            continue
        for pu in core.iter("object"):
            if pu.get("type") == "PU":
                core_of[int(pu.get("os_index", "-1"))] = index
    return core_of


def test_siblings_warning_names_the_vcpus_that_fit_on_whole_cores() -> None:
    base = ("--profile", "hpc", "--memory", "4G", "--page-size", "4K", "--topology", SMT_XML)
    over = hpcvm(*base, "--vcpus", "16", "--format", "json")
    assert over.returncode == 0, over.stderr
    warning = next(w for w in json.loads(over.stdout)["warnings"] if "SMT siblings" in w)
    fits = int(re.search(r"--vcpus (\d+)", warning).group(1))  # type: ignore[union-attr]
    core_of = _xml_cores()
    done = hpcvm(*base, "--vcpus", str(fits), "--format", "json")
    assert done.returncode == 0, done.stderr
    vm = json.loads(done.stdout)
    pus = [p["host_pu"] for p in vm["placements"]]
    assert len({core_of[pu] for pu in pus}) == fits  # one vCPU per physical core
    assert not any("SMT siblings" in w for w in vm["warnings"])
    more = hpcvm(*base, "--vcpus", str(fits + 1), "--format", "json")
    assert any("SMT siblings" in w for w in json.loads(more.stdout)["warnings"])


# -- item 14: the QEMU line says what it leaves out ------------------------------------


def test_qemu_format_says_what_it_leaves_out() -> None:
    args = ("--profile", "hpc", "--vcpus", "2", "--memory", "2G", "--page-size", "4K")
    done = hpcvm(*args, "--topology", SMT_XML, "--format", "qemu")
    assert done.returncode == 0, done.stderr
    vm = json.loads(hpcvm(*args, "--topology", SMT_XML, "--format", "json").stdout)
    lines = done.stdout.splitlines()
    comments = [ln for ln in lines if ln.startswith("#")]
    (command,) = [ln for ln in lines if not ln.startswith("#")]
    argv = shlex.split(command)
    assert argv[0].startswith("qemu-system-")
    text = " ".join(comments)
    # no boot media and no pinning in the line: the comments say so and how to add them
    assert not {"-kernel", "-drive", "-cdrom"} & set(argv)
    assert "-kernel" in text and "-drive" in text
    for p in vm["placements"]:
        assert f"vCPU {p['vcpu']} -> PU {p['host_pu']}" in text
    if "iothread" in command:
        assert "iothread=iothread1" in text  # what the I/O thread is for
    # the whole output is still one shell command: comments, then the line
    check = subprocess.run(["bash", "-n"], input=done.stdout, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
