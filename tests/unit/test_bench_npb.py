"""NPB report parser and suite discovery.

There is no NPB binary on this machine (NPB is not packaged by Debian): the reports in
tests/data/npb are hand-made to the exact layout of NPB's published print_results (see
that directory's README), and the "binaries" here are small shell scripts standing in
for NPB executables so that discovery and naming can be tested.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hpcvm.bench.metrics import ParseError
from hpcvm.bench.npb import MOPS, TIME, NpbSuite, discover, parse_report, report_metrics
from hpcvm.errors import UsageError

DATA = Path(__file__).resolve().parent.parent / "data" / "npb"


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def test_npb33_layout_with_compiled_procs() -> None:
    report = parse_report(fixture("cg.A.4-npb3.3.txt"))
    assert (report.benchmark, report.klass, report.size) == ("CG", "A", "14000")
    assert report.iterations == 15
    assert report.time_s == 3.02
    assert report.mops_total == 495.93
    assert (report.total_processes, report.compiled_procs, report.active_processes) == (
        4,
        4,
        None,
    )
    assert report.verification == "SUCCESSFUL"
    assert report.version == "3.3"


def test_npb34_layout_with_grid_size() -> None:
    report = parse_report(fixture("mg.B.x-npb3.4.txt"))
    assert (report.benchmark, report.klass) == ("MG", "B")
    assert report.size.split("x") == ["256", " 256", " 256"]
    assert (report.time_s, report.mops_total, report.total_processes) == (42.59, 456.98, 2)
    assert report.compiled_procs is None and report.active_processes is None
    assert report.version == "3.4.2"


def test_npb34_active_processes_line() -> None:
    report = parse_report(fixture("bt.A.x-npb3.4-active.txt"))
    assert report.active_processes == 4
    assert report.mops_total == 2742.39


def test_metrics_of_a_verified_run() -> None:
    values = report_metrics(parse_report(fixture("cg.A.4-npb3.3.txt")))
    assert [(v.name, v.value) for v in values] == [("Time_sec", 3.02), ("Mops_total", 495.93)]
    assert TIME.higher_is_better is False and TIME.unit == "s"
    assert MOPS.higher_is_better is True and MOPS.unit == "Mop/s"


def test_unsuccessful_verification_is_a_failed_sample() -> None:
    report = parse_report(fixture("ep.A.x-npb3.4-unsuccessful.txt"))
    assert report.size == "268435456"
    with pytest.raises(ParseError, match="EP class A: verification UNSUCCESSFUL"):
        report_metrics(report)


def test_three_decimal_time() -> None:
    text = fixture("cg.A.4-npb3.3.txt").replace(
        "                     3.02", "                    3.021"
    )
    assert parse_report(text).time_s == 3.021


def test_c_style_report_without_trailing_dot() -> None:
    """NPB's C kernels (IS) print 'IS Benchmark Completed' without the dot."""
    text = fixture("cg.A.4-npb3.3.txt").replace("CG Benchmark Completed.", "CG Benchmark Completed")
    assert parse_report(text).benchmark == "CG"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.replace(" CG Benchmark Completed.", " CG finished"), "no NPB result report"),
        (lambda t: t[: t.index(" Mop/s total")], "no 'Mop/s total' line"),
        (lambda t: t.replace("495.93", "******"), "not a number"),
        (lambda t: "", "no output"),
    ],
)
def test_broken_reports_are_failed_runs(mutate: Callable[[str], str], message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_report(mutate(fixture("cg.A.4-npb3.3.txt")))


# --- discovery and the suite (shell scripts stand in for NPB binaries) -------------------


def fake_binary(directory: Path, name: str, report: str = "cg.A.4-npb3.3.txt") -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\ncat {DATA / report}\n")
    path.chmod(0o755)
    return path


def test_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        discover(tmp_path / "npb" / "bin")


def test_directory_without_binaries_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "README").write_text("not a binary")
    (tmp_path / "cg.A.x").write_text("not executable")
    with pytest.raises(UsageError, match="no NPB binaries"):
        discover(tmp_path)


def test_discovery_groups_by_kernel_and_class(tmp_path: Path) -> None:
    fake_binary(tmp_path, "cg.A.1")
    fake_binary(tmp_path, "cg.A.2")
    fake_binary(tmp_path, "ep.B.x")
    fake_binary(tmp_path, "dt.A.x")  # dt needs arguments: not a suite
    suites = discover(tmp_path)
    assert [s.name for s in suites] == ["npb:cg.A", "npb:ep.B"]
    cg = suites[0]
    assert cg.binary_for(2) == tmp_path / "cg.A.2"
    assert suites[1].binary_for(7) == tmp_path / "ep.B.x"  # 3.4 binaries take any np


def test_kernel_filter(tmp_path: Path) -> None:
    fake_binary(tmp_path, "cg.A.x")
    fake_binary(tmp_path, "cg.B.x")
    fake_binary(tmp_path, "mg.A.x")
    assert [s.name for s in discover(tmp_path, ["cg"])] == ["npb:cg.A", "npb:cg.B"]
    assert [s.name for s in discover(tmp_path, ["CG.b", "mg"])] == ["npb:cg.B", "npb:mg.A"]
    with pytest.raises(UsageError, match=r"'lu' not in .*have cg.A, cg.B, mg.A"):
        discover(tmp_path, ["lu"])


def test_validate_refuses_an_np_without_a_33_binary(tmp_path: Path) -> None:
    fake_binary(tmp_path, "cg.A.1")
    fake_binary(tmp_path, "cg.A.2")
    (suite,) = discover(tmp_path)
    suite.validate([1, 2])
    with pytest.raises(UsageError, match=r"no binary for np=4 .*cg\.A\.4"):
        suite.validate([1, 4])


def test_prepare_runs_the_binary_under_mpirun_from_workdir(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path, "cg.A.x")
    work = tmp_path / "work"
    argv = NpbSuite("cg", "A", {"x": binary}).prepare(work, 2, 0)
    assert argv[:3] == ["/usr/bin/env", "-C", str(work)]
    assert "mpirun" in Path(argv[3]).name
    assert argv[argv.index("-np") + 1] == "2"
    assert argv[-1] == str(binary)


def test_parse_checks_the_binary_reports_the_expected_kernel(tmp_path: Path) -> None:
    suite = NpbSuite("mg", "A", {"x": tmp_path / "mg.A.x"})
    with pytest.raises(ParseError, match="reports CG class A"):
        suite.parse(tmp_path, fixture("cg.A.4-npb3.3.txt"), "", 0)


def test_parse_nonzero_exit(tmp_path: Path) -> None:
    suite = NpbSuite("cg", "A", {"x": tmp_path / "cg.A.x"})
    with pytest.raises(ParseError, match="code 2"):
        suite.parse(tmp_path, fixture("cg.A.4-npb3.3.txt"), "MPI_ABORT was invoked", 2)
    values = suite.parse(tmp_path, fixture("cg.A.4-npb3.3.txt"), "", 0)
    assert [v.value for v in values] == [3.02, 495.93]
