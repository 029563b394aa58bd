"""`hpcvm host` through the real CLI entry: tables and JSON for good sources, and for
bad ones a one-line error with the TopologyError (4) or usage (2) exit code, no
traceback, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvm.cli.main import main
from hpcvm.host import discover
from tests.conftest import TOPOLOGIES, sysfs_root

XML = TOPOLOGIES / "xml"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, expected_code: int) -> None:
    assert code == expected_code
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("hpcvm: error: ")
    assert "Traceback" not in err + out
    assert out == ""


def test_json_is_the_host_topology(capsys: pytest.CaptureFixture[str]) -> None:
    path = XML / "24em64t-2n6c2t-pci.xml"
    code, out, _ = run(["host", "--json", "--topology", str(path)], capsys)
    assert code == 0
    data = json.loads(out)
    assert data == json.loads(discover(xml=path).model_dump_json())
    assert data["source"] == f"xml:{path.resolve()}"


def test_tables_show_what_a_person_checks(
    snapshots_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sysfs_root(snapshots_dir, "16em64t-4s2c2t-offlines")
    code, out, err = run(["host", "--sysfs-root", str(root)], capsys)
    assert code == 0
    for title in ("Host", "NUMA nodes", "Cores and SMT siblings", "Shared caches"):
        assert title in out
    cpu_model = next(
        line.split(":", 1)[1].strip()
        for line in (root / "proc" / "cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    )
    assert cpu_model in out
    assert "offline CPUs" in out
    assert "offline" in err  # the warning, on stderr


def test_tables_show_devices_and_memory_only_nodes(
    snapshots_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        ["host", "--sysfs-root", str(sysfs_root(snapshots_dir, "nvidiagpunumanodes"))], capsys
    )
    assert code == 0
    assert "memory-only" in out and "GPUMemory" in out
    assert "NUMA distances" in out
    code, out, _ = run(["host", "--topology", str(XML / "32em64t-2n8c2t-pci-normalio.xml")], capsys)
    assert code == 0
    assert "PCI devices" in out and "0000:84:00.0" in out and "infiniband" in out


def _bad_inputs(tmp: Path) -> list[tuple[list[str], int]]:
    garbage = tmp / "garbage.xml"
    garbage.write_text("this is not xml\n")
    empty = tmp / "empty.xml"
    empty.write_text("")
    truncated = tmp / "truncated.xml"
    text = (XML / "16em64t-4s2c2t.xml").read_text()
    truncated.write_text(text[: len(text) // 2])
    other_xml = tmp / "other.xml"
    other_xml.write_text('<?xml version="1.0"?><domain type="kvm"><name>x</name></domain>\n')
    not_root = tmp / "notroot"
    (not_root / "proc").mkdir(parents=True)
    return [
        (["--sysfs-root", str(tmp / "missing")], 4),
        (["--sysfs-root", str(garbage)], 4),
        (["--sysfs-root", str(not_root)], 4),
        (["--topology", str(tmp / "missing.xml")], 4),
        (["--topology", str(tmp)], 4),
        (["--topology", str(empty)], 4),
        (["--topology", str(garbage)], 4),
        (["--topology", str(truncated)], 4),
        (["--topology", str(other_xml)], 4),
        (["--topology", str(garbage), "--sysfs-root", str(not_root)], 2),
    ]


def test_bad_inputs_give_one_line_and_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = _bad_inputs(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for args, expected in cases:
        code, out, err = run(["host", *args], capsys)
        assert_one_line_error(code, out, err, expected)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_error_names_the_path_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["host", "--sysfs-root", str(tmp_path)], capsys)
    assert code == 4
    assert str(tmp_path) in err and "sys/devices/system/cpu" in err
    assert "hwloc-gather-topology" in err


def test_archive_folder_instead_of_root_suggests_the_root(
    snapshots_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The archives extract to NAME/NAME-ish/; giving the outer folder is a common slip."""
    root = sysfs_root(snapshots_dir, "2amd64-2n")
    code, _, err = run(["host", "--sysfs-root", str(root.parent)], capsys)
    assert code == 4
    assert f"did you mean {root}?" in err


def test_lstopo_missing_is_a_topology_error(tmp_path: Path) -> None:
    """A real process with a PATH that has no hwloc: exit 4, one line, no traceback."""
    env = dict(os.environ, PATH=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "host"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 4
    assert proc.stderr.strip().count("\n") == 0
    assert "lstopo-no-graphics" in proc.stderr and "apt-get install hwloc" in proc.stderr
    assert "Traceback" not in proc.stderr
