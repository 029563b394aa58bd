"""Extension points from outside the package: a render target, a report format and a
suite, each one
module with one registry call (tests/data/plugins), loaded through HPCVM_PLUGINS by the
real ``hpcvm`` command, appear in --help and work end to end; an unregistered name is a
usage error (exit 2) and a plugin that cannot be imported is a one-line error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PLUGINS = Path(__file__).resolve().parent.parent / "data" / "plugins"
HPCVM = str(Path(sys.executable).with_name("hpcvm"))


def _hpcvm(*args: str, plugins: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HPCVM_PLUGINS=plugins, PYTHONPATH=str(PLUGINS))
    return subprocess.run(
        [HPCVM, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


def test_a_plugin_suite_and_report_format_work_end_to_end(tmp_path: Path) -> None:
    plugins = "hpcvm_demo_suite,hpcvm_demo_format"
    assert "echo42" in _hpcvm("bench", "--help", plugins=plugins, cwd=tmp_path).stdout
    assert "tsv" in _hpcvm("report", "--help", plugins=plugins, cwd=tmp_path).stdout
    out = tmp_path / "r"
    bench = _hpcvm(
        "bench", "--env", "native", "--suite", "echo42", "--reps", "2", "--out", str(out),
        plugins=plugins, cwd=tmp_path,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    assert "echo42: answer" in bench.stdout
    report = _hpcvm("report", str(out), "--format", "tsv", plugins=plugins, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (out / "report" / "report.tsv").read_text() == "native\tanswer\t42.0\n"


def test_unregistered_names_and_broken_plugins_are_refused(tmp_path: Path) -> None:
    no_plugin = _hpcvm("bench", "--env", "native", "--suite", "echo42", plugins="", cwd=tmp_path)
    assert no_plugin.returncode == 2 and "unknown suite 'echo42'" in no_plugin.stderr
    fmt = _hpcvm("report", str(tmp_path), "--format", "tsv", plugins="", cwd=tmp_path)
    assert fmt.returncode == 2 and "tsv" in fmt.stderr
    broken = _hpcvm("host", plugins="no_such_hpcvm_plugin", cwd=tmp_path)
    assert broken.returncode == 2
    lines = broken.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_such_hpcvm_plugin" in lines[0] and "Traceback" not in lines[0]


def test_a_plugin_render_target_prints_the_plan(tmp_path: Path) -> None:
    """The planner's own pins (its JSON output) are what the plugin target prints."""
    import json

    xml = PLUGINS.parents[3] / "shared" / "topologies" / "xml" / "24em64t-2n6c2t-pci.xml"
    args = ("plan", "--profile", "pinned", "--vcpus", "3", "--memory", "1G", "--topology", str(xml))
    assert "pins" in _hpcvm("plan", "--help", plugins="hpcvm_demo_target", cwd=tmp_path).stdout
    pins = _hpcvm(*args, "--format", "pins", plugins="hpcvm_demo_target", cwd=tmp_path)
    assert pins.returncode == 0, pins.stderr
    plan = json.loads(_hpcvm(*args, "--format", "json", plugins="", cwd=tmp_path).stdout)
    expected = [f"vcpu{p['vcpu']} pu{p['host_pu']}" for p in plan["placements"]]
    assert pins.stdout.splitlines() == expected
    unknown = _hpcvm(*args, "--format", "pins", plugins="", cwd=tmp_path)
    assert unknown.returncode == 2 and "pins" in unknown.stderr
