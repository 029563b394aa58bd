"""The NPB suite end to end with real processes: prepare's argv is run (real Open MPI
mpirun, as ``bench`` runs it natively) and its output parsed.

The programs mpirun starts are STAND-INS: NPB cannot be downloaded here, so each
"binary" is a wrapper named like an NPB binary around tests/data/npb/npb_standin.py,
which replays one REAL recorded NPB run (tests/data/npb/real/, see the README there):
its stdout, its own stderr, and its end (exit code, or death by the same signal), from
rank 0 as NPB does. A stand-in refuses to replay a run recorded with another process
count, so each case runs exactly as recorded. Installing a recording under another
name reproduces a misnamed binary.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvm.bench.core.metrics import ParseError
from hpcvm.bench.suites.npb.suite import NpbSuite, discover

DATA = Path(__file__).resolve().parent.parent / "data" / "npb"
STANDIN = DATA / "npb_standin.py"
TIMEOUT = 300  # a shared, slow machine; never a timed assertion


def install(bin_dir: Path, case: str, name: str | None = None) -> Path:
    """A stand-in for the binary recorded in ``case``, named ``name`` (default: the
    recorded binary's own name)."""
    meta = json.loads((DATA / "real" / case / "meta.json").read_text())
    path = bin_dir / (name or meta["binary"])
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDIN} {DATA / 'real' / case}\n")
    path.chmod(0o755)
    return path


def run_suite(
    suite: NpbSuite, workdir: Path, np: int
) -> tuple[subprocess.CompletedProcess[str], Path]:
    suite.validate([np])
    argv = suite.prepare(workdir, np, 0)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    return result, workdir


def only(bin_dir: Path, kernel: str, size: str = "quick") -> NpbSuite:
    (suite,) = discover(bin_dir, [kernel], size=size)
    return suite


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    return path


def needs_cpus(count: int) -> None:
    if len(os.sched_getaffinity(0)) < count:
        pytest.skip(f"needs {count} CPUs for {count} bound MPI ranks")


def recorded_field(case: str, key: str) -> str:
    text = (DATA / "real" / case / "stdout").read_text()
    match = re.search(rf"^ {re.escape(key)}\s*=\s*(\S+)", text, re.MULTILINE)
    assert match
    return match[1]


def test_a_good_34_run(bin_dir: Path, tmp_path: Path) -> None:
    install(bin_dir, "npb3.4-cg.S.x-np1")
    suite = only(bin_dir, "cg")
    result, work = run_suite(suite, tmp_path / "work", 1)
    assert result.returncode == 0
    values = suite.parse(work, result.stdout, result.stderr, result.returncode)
    case = "npb3.4-cg.S.x-np1"
    expected = [
        float(recorded_field(case, "Time in seconds")),
        float(recorded_field(case, "Mop/s total")),
    ]
    assert [v.value for v in values] == expected
    facts = suite.sample_facts(work, result.stdout, result.stderr, result.returncode)
    assert facts["verification"] == "SUCCESSFUL" and facts["binary"] == "cg.S.x"
    assert "MCW rank 0 bound" in result.stderr  # mpirun really ran it, bound


def test_a_good_33_run_on_two_processes(bin_dir: Path, tmp_path: Path) -> None:
    needs_cpus(2)
    install(bin_dir, "npb3.3-is.S.2-np2")
    suite = only(bin_dir, "is")
    result, work = run_suite(suite, tmp_path / "work", 2)
    assert [v.ok for v in suite.parse(work, result.stdout, result.stderr, result.returncode)] == [
        True,
        True,
    ]
    # IS S prints its time as 0.00: the resolution check says so, Mop/s is fine
    warning = suite.resolution_warning("Time_sec", 2, [0.0, 0.0])
    assert warning is not None and warning.startswith("IS time, np 2:")


def test_wrong_class(bin_dir: Path, tmp_path: Path) -> None:
    install(bin_dir, "npb3.4-cg.W.x-np1", name="cg.S.x")
    suite = only(bin_dir, "cg")
    result, work = run_suite(suite, tmp_path / "work", 1)
    assert result.returncode == 0
    with pytest.raises(ParseError, match=r"cg\.S\.x reports CG class W"):
        suite.parse(work, result.stdout, result.stderr, result.returncode)


def test_33_binary_compiled_for_another_np(bin_dir: Path, tmp_path: Path) -> None:
    """The issue's case: a 1-process 3.3 IS binary named is.S.2, run on 2."""
    needs_cpus(2)
    install(bin_dir, "npb3.3-is.S.1-np2", name="is.S.2")
    suite = only(bin_dir, "is")
    result, work = run_suite(suite, tmp_path / "work", 2)
    assert result.returncode != 0
    with pytest.raises(ParseError) as caught:
        suite.parse(work, result.stdout, result.stderr, result.returncode)
    assert str(caught.value) == (
        "npb:is.S: ERROR: compiled for 1 processes; Number of active processes: 2"
    )


def test_33_cg_for_another_np_exits_0_but_fails(bin_dir: Path, tmp_path: Path) -> None:
    install(bin_dir, "npb3.3-cg.S.2-np1", name="cg.S.1")
    suite = only(bin_dir, "cg")
    result, work = run_suite(suite, tmp_path / "work", 1)
    assert result.returncode == 0  # the failure mpirun does not see
    with pytest.raises(ParseError, match=r"Error: num of procs allocated \( 1 \) is not equal"):
        suite.parse(work, result.stdout, result.stderr, result.returncode)


def test_crash(bin_dir: Path, tmp_path: Path) -> None:
    install(bin_dir, "npb3.3-mg.S.2-np1", name="mg.S.1")
    suite = only(bin_dir, "mg")
    result, work = run_suite(suite, tmp_path / "work", 1)
    assert result.returncode != 0
    with pytest.raises(ParseError) as caught:
        suite.parse(work, result.stdout, result.stderr, result.returncode)
    message = str(caught.value)
    assert "killed by signal 11 (Segmentation fault)" in message
    assert "WARNING: compiled for 2 processes" in message
    assert "\n" not in message


def test_unsuccessful_verification(bin_dir: Path, tmp_path: Path) -> None:
    install(bin_dir, "npb3.4-cg.S.x-np1-wrong-reference")
    suite = only(bin_dir, "cg")
    result, work = run_suite(suite, tmp_path / "work", 1)
    assert result.returncode == 0
    with pytest.raises(ParseError, match=r"^npb:cg\.S: verification UNSUCCESSFUL"):
        suite.parse(work, result.stdout, result.stderr, result.returncode)
    facts = suite.sample_facts(work, result.stdout, result.stderr, result.returncode)
    assert facts["verification"] == "UNSUCCESSFUL"


def test_no_report_after_a_warning(bin_dir: Path, tmp_path: Path) -> None:
    install(bin_dir, "npb3.3-bt.S.4-np1", name="bt.S.1")
    suite = only(bin_dir, "bt")
    result, work = run_suite(suite, tmp_path / "work", 1)
    assert result.returncode == 0
    with pytest.raises(ParseError, match="no NPB result report: WARNING: compiled for 4"):
        suite.parse(work, result.stdout, result.stderr, result.returncode)


def test_a_stand_in_refuses_another_process_count(bin_dir: Path, tmp_path: Path) -> None:
    """The stand-ins' own guard, so the cases above cannot replay the wrong run."""
    needs_cpus(2)
    install(bin_dir, "npb3.4-cg.S.x-np1")
    suite = only(bin_dir, "cg")
    result, _ = run_suite(suite, tmp_path / "work", 2)
    assert result.returncode == 99
    assert "ran on 1 processes, not 2" in result.stderr
