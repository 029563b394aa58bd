"""NPB report parser, failure reasons, facts and suite discovery.

Two kinds of NPB output are used, neither made by the code under test:
- ``tests/data/npb/real/<case>/``: REAL output of NPB 3.3.1 and 3.4 MPI kernels built
  from NPB's sources on the project's machine and run under its Open MPI (stdout, stderr
  and mpirun's exit code as recorded; how: that directory's README);
- ``tests/data/npb/*.txt``: hand-made reports in the layout of other NPB releases
  (3.3's and 3.4.2's ``print_results``), see the README.
The "binaries" in discovery tests are small shell scripts named like NPB's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcvm.bench.core.metrics import ParseError
from hpcvm.bench.suites.npb.report import failure_reason, verification
from hpcvm.bench.suites.npb.suite import (
    MOPS,
    RUN_FILE,
    TIME,
    NpbSuite,
    discover,
    parse_report,
    report_metrics,
    sample_facts,
)
from hpcvm.errors import UsageError

DATA = Path(__file__).resolve().parent.parent / "data" / "npb"
REAL = DATA / "real"


def fixture(name: str) -> str:
    return (DATA / name).read_text()


class Recorded:
    """One recorded real NPB run."""

    def __init__(self, case: str) -> None:
        self.dir = REAL / case
        self.meta = json.loads((self.dir / "meta.json").read_text())
        self.stdout = (self.dir / "stdout").read_text()
        self.stderr = (self.dir / "stderr").read_text()
        self.exit_code = int((self.dir / "exit_code").read_text())

    def field(self, key: str) -> str:
        """A report field read with a plain regex, independent of the parser."""
        match = re.search(rf"^ {re.escape(key)}\s*=\s*(\S+)\s*$", self.stdout, re.MULTILINE)
        assert match, key
        return match[1]

    def suite_and_workdir(self, tmp_path: Path, binary: str | None = None) -> tuple[NpbSuite, Path]:
        """A suite for the recorded binary (or ``binary``, a name it was installed
        under), and a run directory as prepare leaves it for this run's np."""
        name = binary or self.meta["binary"]
        kernel, klass, procs = name.split(".")
        path = tmp_path / name
        (tmp_path / RUN_FILE).write_text(json.dumps({"np": self.meta["np"], "binary": str(path)}))
        return NpbSuite(kernel, klass, {procs: path}), tmp_path

    def parse(self, tmp_path: Path, binary: str | None = None) -> list[float | None]:
        suite, workdir = self.suite_and_workdir(tmp_path, binary)
        values = suite.parse(workdir, self.stdout, self.stderr, self.exit_code)
        return [v.value for v in values]

    def failure(self, tmp_path: Path, binary: str | None = None) -> str:
        with pytest.raises(ParseError) as caught:
            self.parse(tmp_path, binary)
        return str(caught.value)


# --- real NPB output: good runs ----------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "npb3.4-cg.S.x-np1",
        "npb3.4-cg.S.x-np2",
        "npb3.4-cg.W.x-np1",
        "npb3.4-ep.S.x-np1",
        "npb3.4-is.S.x-np1",
        "npb3.3-cg.S.1-np1",
        "npb3.3-is.S.2-np2",
    ],
)
def test_real_good_runs_give_time_and_mops(case: str, tmp_path: Path) -> None:
    run = Recorded(case)
    assert run.exit_code == 0
    assert run.parse(tmp_path) == [
        float(run.field("Time in seconds")),
        float(run.field("Mop/s total")),
    ]
    facts = sample_facts(run.stdout)
    assert facts["verification"] == "SUCCESSFUL"
    assert facts["class"] == run.field("Class")
    assert facts["processes"] == str(run.meta["np"])
    assert facts["npb_version"].startswith(run.meta["npb"])


def test_real_34_report_has_active_procs_and_33_compiled_procs() -> None:
    new = parse_report(Recorded("npb3.4-cg.S.x-np2").stdout)
    assert (new.total_processes, new.active_processes, new.compiled_procs) == (2, 2, None)
    old = parse_report(Recorded("npb3.3-is.S.2-np2").stdout)
    assert (old.total_processes, old.active_processes, old.compiled_procs) == (2, None, 2)
    assert old.benchmark == "IS"  # C report: "IS Benchmark Completed" without the dot


# --- real NPB output: each way a run fails ------------------------------------------------


def test_33_binary_for_another_np_fails_in_npbs_own_words(tmp_path: Path) -> None:
    """The issue's case: a 3.3 IS built for 1 process, started on 2."""
    run = Recorded("npb3.3-is.S.1-np2")
    assert " ERROR: compiled for 1 processes" in run.stdout and run.exit_code == 1
    message = run.failure(tmp_path, binary="is.S.2")
    assert message == "npb:is.S: ERROR: compiled for 1 processes; Number of active processes: 2"


def test_33_cg_for_another_np_exits_0_and_still_fails(tmp_path: Path) -> None:
    """3.3 CG prints a four-line 'Error:' and exits 0 (Fortran STOP): no report."""
    run = Recorded("npb3.3-cg.S.2-np1")
    assert run.exit_code == 0
    assert run.failure(tmp_path, binary="cg.S.1") == (
        "npb:cg.S: Error: num of procs allocated ( 1 ) is not equal to compiled number "
        "of procs ( 2 )"
    )


def test_33_bt_for_another_np_prints_no_report(tmp_path: Path) -> None:
    run = Recorded("npb3.3-bt.S.4-np1")
    assert run.exit_code == 0
    assert run.failure(tmp_path, binary="bt.S.1") == (
        "npb:bt.S: no NPB result report: WARNING: compiled for 4 processes | "
        "Problem size too big for compiled array sizes"
    )


def test_crash_names_the_signal_and_npbs_warning(tmp_path: Path) -> None:
    """3.3 MG built for 2 processes segfaults on 1; mpirun exits 128 + 11."""
    run = Recorded("npb3.3-mg.S.2-np1")
    assert run.exit_code == 139
    message = run.failure(tmp_path, binary="mg.S.1")
    assert message.startswith("npb:mg.S: a process was killed by signal 11 (Segmentation fault)")
    assert "WARNING: compiled for 2 processes" in message
    assert "MCW rank" not in message and "[[" not in message  # no Open MPI noise, no job ids


def test_a_killed_process_without_mpirun_is_named_by_its_signal() -> None:
    assert failure_reason("", "", -9) == "killed by signal 9 (Killed)"


def test_33_binary_compiled_for_another_np_that_runs_anyway(tmp_path: Path) -> None:
    """3.3 EP built for 1 runs on 2 and says so only in its report."""
    run = Recorded("npb3.3-ep.S.1-np2")
    assert run.field("Compiled procs") == "1"
    message = run.failure(tmp_path, binary="ep.S.2")
    assert "the binary" in message and "was compiled for 1 process (NPB 3.3), not 2" in message
    assert "rename it ep.S.1" in message


def test_34_power_of_two_error_line(tmp_path: Path) -> None:
    for case in ("npb3.4-cg.S.x-np3", "npb3.4-is.S.x-np3"):
        run = Recorded(case)
        assert run.exit_code != 0
        kernel = run.meta["binary"].split(".")[0]
        assert run.failure(tmp_path) == (
            f"npb:{kernel}.S: ERROR: Number of processes (3) is not a power of two (2?)"
        )


def test_34_run_on_fewer_processes_than_started_fails(tmp_path: Path) -> None:
    """3.4.0 BT on 2 processes silently computes on 1; FT on 3 on 2."""
    bt = Recorded("npb3.4-bt.S.x-np2")
    assert (bt.field("Total processes"), bt.field("Active procs")) == ("2", "1")
    assert bt.failure(tmp_path) == (
        "npb:bt.S: only 1 of 2 processes worked (NPB BT needs a square number of processes)"
    )
    ft = Recorded("npb3.4-ft.S.x-np3")
    assert "only 2 of 3 processes worked" in ft.failure(tmp_path)


def test_wrong_class_binary_fails(tmp_path: Path) -> None:
    """The issue's case: a class W binary named cg.S.x."""
    message = Recorded("npb3.4-cg.W.x-np1").failure(tmp_path, binary="cg.S.x")
    assert message.startswith("npb:cg.S: the binary")
    assert "cg.S.x reports CG class W" in message


def test_unsuccessful_verification_is_a_failed_sample_with_the_verdict_as_data(
    tmp_path: Path,
) -> None:
    run = Recorded("npb3.4-cg.S.x-np1-wrong-reference")
    assert "VERIFICATION FAILED" in run.stdout
    assert run.failure(tmp_path).startswith("npb:cg.S: verification UNSUCCESSFUL")
    assert sample_facts(run.stdout)["verification"] == "UNSUCCESSFUL"


def test_verification_not_performed_is_told_apart(tmp_path: Path) -> None:
    run = Recorded("npb3.4-mg.S.x-np1-class-U")
    assert run.field("Verification") == "UNSUCCESSFUL"  # what the report itself says
    assert verification(run.stdout) == "not performed"
    assert run.failure(tmp_path).startswith("npb:mg.S: verification not performed")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("npb3.3-is.S.1-np2", {}),
        ("npb3.3-mg.S.2-np1", {}),
        (
            "npb3.4-bt.S.x-np2",
            {
                "verification": "SUCCESSFUL",
                "class": "S",
                "processes": "2",
                "active_processes": "1",
                "npb_version": "3.4",
            },
        ),
    ],
)
def test_facts_of_failed_runs(case: str, expected: dict[str, str]) -> None:
    assert sample_facts(Recorded(case).stdout) == expected


def test_suite_facts_name_the_binary_that_ran(tmp_path: Path) -> None:
    run = Recorded("npb3.4-cg.S.x-np1")
    suite, workdir = run.suite_and_workdir(tmp_path)
    facts = suite.sample_facts(workdir, run.stdout, run.stderr, run.exit_code)
    assert facts["binary"] == "cg.S.x" and facts["active_processes"] == "1"


# --- hand-made reports in other releases' layouts ----------------------------------------


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


def test_npb342_active_processes_line() -> None:
    report = parse_report(fixture("bt.A.x-npb3.4-active.txt"))
    assert report.active_processes == 4
    assert report.mops_total == 2742.39


def test_metrics_of_a_verified_run() -> None:
    values = report_metrics(parse_report(fixture("cg.A.4-npb3.3.txt")))
    assert [(v.name, v.value) for v in values] == [("Time_sec", 3.02), ("Mops_total", 495.93)]
    assert TIME.higher_is_better is False and TIME.unit == "s"
    assert MOPS.higher_is_better is True and MOPS.unit == "Mop/s"


def test_unsuccessful_report_metrics() -> None:
    report = parse_report(fixture("ep.A.x-npb3.4-unsuccessful.txt"))
    assert report.size == "268435456"
    with pytest.raises(ParseError, match="EP class A: verification UNSUCCESSFUL"):
        report_metrics(report)


def test_three_decimal_time() -> None:
    text = fixture("cg.A.4-npb3.3.txt").replace(
        "                     3.02", "                    3.021"
    )
    assert parse_report(text).time_s == 3.021


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


def test_verification_detail_error_is_not_an_error_line(tmp_path: Path) -> None:
    """CG prints 'Error is 0.1E-14' in a good run: not a failure."""
    run = Recorded("npb3.4-cg.S.x-np1")
    assert " Error is " in run.stdout
    assert failure_reason(run.stdout, run.stderr, 0) is None


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


def test_without_kernels_every_kernel_in_the_sizes_class(tmp_path: Path) -> None:
    for name in ("cg.A.1", "cg.A.2", "cg.W.x", "ep.A.x", "ep.B.x", "dt.A.x"):
        fake_binary(tmp_path, name)
    suites = discover(tmp_path, size="medium")
    assert [s.name for s in suites] == ["npb:cg.A", "npb:ep.A"]  # dt is never a suite
    assert suites[0].binary_for(2) == tmp_path / "cg.A.2"
    assert suites[1].binary_for(7) == tmp_path / "ep.A.x"  # 3.4 binaries take any np
    assert [s.name for s in discover(tmp_path)] == ["npb:cg.W"]  # default size small: W
    with pytest.raises(UsageError, match=r"no class S NPB binaries .*--size quick runs class S"):
        discover(tmp_path, size="quick")


@pytest.mark.parametrize(
    ("size", "expected"), [("quick", "npb:cg.S"), ("small", "npb:cg.W"), ("medium", "npb:cg.A")]
)
def test_a_plain_kernel_runs_the_one_class_its_size_picks(
    tmp_path: Path, size: str, expected: str
) -> None:
    for klass in "SWAB":
        fake_binary(tmp_path, f"cg.{klass}.x")
    assert [s.name for s in discover(tmp_path, ["cg"], size=size)] == [expected]


def test_named_classes_and_plain_kernels_together(tmp_path: Path) -> None:
    for name in ("cg.W.x", "cg.B.x", "mg.W.x", "is.A.x"):
        fake_binary(tmp_path, name)
    suites = discover(tmp_path, ["CG.b", "mg", "cg", "cg.W"], size="small")
    assert [s.name for s in suites] == ["npb:cg.B", "npb:mg.W", "npb:cg.W"]


def test_a_missing_class_says_how_to_get_one(tmp_path: Path) -> None:
    fake_binary(tmp_path, "cg.A.x")
    with pytest.raises(UsageError) as caught:
        discover(tmp_path, ["cg"], size="small")
    message = str(caught.value)
    assert "no NPB cg.W binary" in message and "--size small runs class W" in message
    assert "make cg CLASS=W" in message and "--npb-kernels cg.A" in message
    with pytest.raises(UsageError, match=r"no NPB lu\.A binary .*asked for lu\.A"):
        discover(tmp_path, ["lu.A"])


def test_a_memory_fraction_picks_no_class(tmp_path: Path) -> None:
    fake_binary(tmp_path, "cg.A.x")
    with pytest.raises(UsageError, match=r"--size 0.05 picks no NPB class"):
        discover(tmp_path, ["cg"], size=0.05)
    assert [s.name for s in discover(tmp_path, ["cg.A"], size=0.05)] == ["npb:cg.A"]


def test_dt_is_refused_with_the_reason_even_when_built(tmp_path: Path) -> None:
    fake_binary(tmp_path, "dt.S.x")
    fake_binary(tmp_path, "cg.S.x")
    with pytest.raises(UsageError) as caught:
        discover(tmp_path, ["cg", "dt"], size="quick")
    message = str(caught.value)
    assert "not run by hpcvm" in message and "graph" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("selector", "message"),
    [("xx", "unknown NPB kernel 'xx': choose from bt, cg"), ("cg.Q", "unknown NPB class")],
)
def test_unknown_kernels_and_classes(tmp_path: Path, selector: str, message: str) -> None:
    fake_binary(tmp_path, "cg.A.x")
    with pytest.raises(UsageError, match=message):
        discover(tmp_path, [selector])


def test_validate_refuses_an_np_without_a_33_binary(tmp_path: Path) -> None:
    fake_binary(tmp_path, "cg.A.1")
    fake_binary(tmp_path, "cg.A.2")
    (suite,) = discover(tmp_path, size="medium")
    suite.validate([1, 2])
    with pytest.raises(UsageError, match=r"no binary for np=4 .*cg\.A\.4"):
        suite.validate([1, 4])


def test_validate_refuses_process_counts_the_kernel_cannot_use(tmp_path: Path) -> None:
    for name in ("bt.S.x", "cg.S.x", "ep.S.x"):
        fake_binary(tmp_path, name)
    bt, cg, ep = discover(tmp_path, size="quick")
    bt.validate([1, 4, 9])
    with pytest.raises(UsageError, match=r"npb:bt.S: NPB BT .* square number .*--np 1\b"):
        bt.validate([1, 2])
    with pytest.raises(UsageError, match=r"power-of-two number of processes, not --np 6: .*--np 4"):
        cg.validate([6])
    ep.validate([1, 3, 5])


def test_prepare_runs_the_binary_under_mpirun_from_workdir(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path, "cg.A.x")
    work = tmp_path / "work"
    argv = NpbSuite("cg", "A", {"x": binary}).prepare(work, 2, 0)
    assert argv[:3] == ["/usr/bin/env", "-C", str(work)]
    assert "mpirun" in Path(argv[3]).name
    assert argv[argv.index("-np") + 1] == "2"
    assert argv[-1] == str(binary)
    assert json.loads((work / RUN_FILE).read_text()) == {"np": 2, "binary": str(binary)}


def test_parse_checks_the_binary_reports_the_expected_kernel(tmp_path: Path) -> None:
    suite = NpbSuite("mg", "A", {"x": tmp_path / "mg.A.x"})
    with pytest.raises(ParseError, match="reports CG class A"):
        suite.parse(tmp_path, fixture("cg.A.4-npb3.3.txt"), "", 0)


def test_parse_nonzero_exit(tmp_path: Path) -> None:
    suite = NpbSuite("cg", "A", {"x": tmp_path / "cg.A.x"})
    with pytest.raises(ParseError, match="exited with code 2: MPI_ABORT was invoked"):
        suite.parse(tmp_path, fixture("cg.A.4-npb3.3.txt"), "MPI_ABORT was invoked", 2)
    values = suite.parse(tmp_path, fixture("cg.A.4-npb3.3.txt"), "", 0)
    assert [v.value for v in values] == [3.02, 495.93]


def test_labels_and_resolution_as_data() -> None:
    suite = NpbSuite("cg", "S", {"x": Path("/npb/cg.S.x")})
    assert suite.label(TIME.name, 1) == "CG time, np 1"
    assert suite.label(MOPS.name, 4) == "CG Mop/s, np 4"
    assert suite.resolution(TIME.name) == 0.01 and suite.resolution(MOPS.name) == 0.01
    assert suite.resolution("other") is None
