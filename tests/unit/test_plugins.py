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


def test_a_plugin_suite_owns_its_option(tmp_path: Path) -> None:
    """The demo suite's own --echo-number is in --help, reaches its suite (the number it
    prints is the measured one), is refused for a run without the suite, and does not
    exist without the plugin."""
    plugins = "hpcvm_demo_suite,hpcvm_demo_format"
    assert "--echo-number" in _hpcvm("bench", "--help", plugins=plugins, cwd=tmp_path).stdout
    out = tmp_path / "r"
    args = ("bench", "--env", "native", "--reps", "2", "--out", str(out))
    bench = _hpcvm(*args, "--suite", "echo42", "--echo-number", "7", plugins=plugins, cwd=tmp_path)
    assert bench.returncode == 0, bench.stderr
    report = _hpcvm("report", str(out), "--format", "tsv", plugins=plugins, cwd=tmp_path)
    assert (out / "report" / "report.tsv").read_text() == "native\tanswer\t7.0\n", report.stderr
    other = _hpcvm(*args, "--suite", "noise", "--echo-number", "7", plugins=plugins, cwd=tmp_path)
    assert other.returncode == 2 and "--echo-number is an option of --suite echo42" in other.stderr
    bare = _hpcvm(*args, "--suite", "noise", "--echo-number", "7", plugins="", cwd=tmp_path)
    assert bare.returncode == 2 and "--echo-number" in bare.stderr


def test_a_plugin_environment_kind_runs_beside_native_and_is_reported(tmp_path: Path) -> None:
    """The demo kind ``noaslr`` (native under ``setarch -R``) is listed, runs its
    samples where it says (the ADDR_NO_RANDOMIZE bit, 0x40000, is set in what it runs
    and not natively), is stored, and the report shows it in the kind's own colour."""
    plugins = "hpcvm_demo_env,hpcvm_demo_format"
    assert "noaslr" in _hpcvm("bench", "--help", plugins=plugins, cwd=tmp_path).stdout
    out = tmp_path / "r"
    personality = "sh -c 'echo $((0x$(cat /proc/self/personality) + 1))'"
    bench = _hpcvm(
        "bench", "--env", "native", "--env", "noaslr", "--suite", "cmd", "--cmd", personality,
        "--metric", r"^(\d+)", "--higher-is-better", "--reps", "2", "--out", str(out),
        plugins=plugins, cwd=tmp_path,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    assert any(line.split()[:1] == ["noaslr"] for line in bench.stdout.splitlines())
    report = _hpcvm("report", str(out), "--format", "tsv", plugins=plugins, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    rows = dict(
        line.split("\t")[0::2]
        for line in (out / "report/report.tsv").read_text().split("\n")
        if line
    )
    assert float(rows["native"]) - 1 == 0 and int(float(rows["noaslr"])) - 1 == 0x40000
    html = _hpcvm("report", str(out), plugins=plugins, cwd=tmp_path)
    assert html.returncode == 0, html.stderr
    assert "#006d2c" in (out / "report" / "report.html").read_text()
    bare = _hpcvm("bench", "--env", "noaslr", "--suite", "noise", plugins="", cwd=tmp_path)
    assert bare.returncode == 2 and "unknown environment 'noaslr'" in bare.stderr


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


def _installed(site: Path, group: str) -> None:
    """A distribution as pip leaves it in site-packages: a ``.dist-info`` directory whose
    entry_points.txt names the demo suite's module under ``group``."""
    info = site / "hpcvm_demo-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hpcvm-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\necho42 = hpcvm_demo_suite\n")


def test_an_installed_packages_entry_point_is_loaded(tmp_path: Path) -> None:
    """The entry point of a distribution on the path is found (through importlib.metadata,
    which hpcvm imports only once some distribution names the group) and its suite is
    there, with HPCVM_PLUGINS empty; under another group it is not."""
    for group, listed in (("hpcvm.plugins", True), ("other.plugins", False)):
        site = tmp_path / group
        _installed(site, group)
        env = dict(os.environ, HPCVM_PLUGINS="", PYTHONPATH=f"{site}{os.pathsep}{PLUGINS}")
        done = subprocess.run(
            [HPCVM, "bench", "--help"], capture_output=True, text=True, env=env, timeout=600
        )
        assert done.returncode == 0, done.stderr
        assert ("echo42" in done.stdout) is listed, group


def test_the_metadata_scan_runs_only_where_a_distribution_names_the_group(
    tmp_path: Path,
) -> None:
    from hpcvm.plugins import _group_declared

    _installed(tmp_path / "with", "hpcvm.plugins")
    _installed(tmp_path / "without", "console_scripts")
    assert _group_declared([str(tmp_path / "with")])
    assert not _group_declared([str(tmp_path / "without"), str(tmp_path / "missing")])
    archive = tmp_path / "eggs.zip"
    archive.write_bytes(b"")
    assert _group_declared([str(archive)])  # a zip's metadata: left to importlib.metadata
