"""A failed sample is never silent (issue 16), with real processes: the real ``hpcvm
bench`` runs real commands that fail in each way a benchmark can, natively (a VM adds
nothing to how failures are counted: the same runner records them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime_support import hpcvm, one_line_error

pytestmark = pytest.mark.integration

NATIVE_CMD = ("bench", "--env", "native", "--suite", "cmd", "--lower-is-better")


def _bench(out: Path, cmd: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return hpcvm(*NATIVE_CMD, "--cmd", cmd, "--metric", "value ([0-9]+)", "--out", str(out), *extra)


def _rows(out: Path) -> list[dict[str, object]]:
    proc = hpcvm("results", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, object]] = json.loads(proc.stdout)
    return rows


def test_a_failing_command_is_reported_counted_and_fails_the_run(tmp_path: Path) -> None:
    out = tmp_path / "r1"
    proc = _bench(out, "sh -c 'echo value 5; echo broken >&2; exit 3'", "--reps", "4")
    code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    assert code == 9, stderr
    failed_lines = [ln for ln in stderr.splitlines() if ln.startswith("hpcvm: failed: native cmd")]
    # reported as it happens: the warm-up and repetition 1, then the cell is given up
    assert len(failed_lines) == 2, stderr
    assert "(warm-up)" in failed_lines[0] and "(rep 1)" in failed_lines[1]
    assert all("exited with code 3: broken" in ln for ln in failed_lines)
    assert "not repeated" in stderr and "failed the same way" in stderr
    error = one_line_error(proc)
    assert "no valid sample for native cmd" in error and "exited with code 3" in error
    assert "FAILED" in stdout and "failed samples" in stdout
    assert "2 of 2" in " ".join(stdout.split())
    # the failed-samples table counts the warm-up, the JSON below measured repetitions
    # only: its header must say so, or 2 and 1 read as a contradiction
    assert "failed (incl. warm-up)" in stdout
    [row] = _rows(out)
    assert (row["n"], row["failed_samples"], row["mean"]) == (0, 1, None)
    assert "exited with code 3: broken" in str(row["failure_reason"])
    csv = hpcvm("results", str(out), "--csv", str(tmp_path / "s.csv"))
    assert csv.returncode == 0
    assert "exited with code 3" in (tmp_path / "s.csv").read_text()


def test_a_missing_metric_names_the_output(tmp_path: Path) -> None:
    out = tmp_path / "r2"
    proc = _bench(out, "echo nothing", "--reps", "2")
    stderr = proc.stderr
    assert proc.returncode == 9, stderr
    assert "hpcvm: failed: native cmd (warm-up): --metric regex" in stderr
    assert "matched nothing in the output: nothing" in stderr
    [row] = _rows(out)
    assert row["n"] == 0 and "matched nothing" in str(row["failure_reason"])


def test_some_failed_samples_keep_the_valid_ones(tmp_path: Path) -> None:
    """Every third run fails: the valid samples are summarised as usual, the failures
    are counted beside them, and the run says it finished with failures (exit 0)."""
    counter = tmp_path / "count"
    counter.write_text("0")
    script = (
        f"n=$(cat {counter}); n=$((n+1)); echo $n > {counter}; "
        "if [ $((n % 3)) -eq 0 ]; then echo flaky >&2; exit 4; fi; echo value 7"
    )
    out = tmp_path / "r3"
    proc = _bench(out, f"sh -c '{script}'", "--reps", "5")
    stdout, stderr = proc.stdout, proc.stderr
    assert proc.returncode == 0, stderr
    assert "finished with failures" in stderr and "status finished with failures" in stdout
    assert stderr.count("hpcvm: failed: native cmd") == 2  # runs 3 and 6 of 6
    [row] = _rows(out)
    # run 1 is the warm-up; runs 2-6 are repetitions 1-5, of which runs 3 and 6 failed
    assert (row["n"], row["failed_samples"], row["mean"]) == (3, 2, 7.0)
    assert "exited with code 4: flaky" in str(row["failure_reason"])


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--suite", "noise", "--npb-dir", "/usr/bin"), "--npb-dir"),
        (("--suite", "noise", "--npb-kernels", "cg"), "--npb-kernels"),
        (("--suite", "noise", "--cmd", "true"), "--cmd"),
        (("--suite", "noise", "--lower-is-better"), "--lower-is-better"),
        (("--suite", "noise", "--unit", "s"), "--unit"),
        (("--suite", "noise", "--metric", "v ([0-9]+)"), "--metric"),
    ],
)
def test_an_option_without_its_suite_is_refused(
    tmp_path: Path, args: tuple[str, ...], flag: str
) -> None:
    out = tmp_path / "never"
    proc = hpcvm("bench", "--env", "native", *args, "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    line = one_line_error(proc)
    assert flag in line and "does not select" in line
    assert not out.exists()


# -- NPB ----------------------------------------------------------------------------------
# NPB cannot be downloaded here: each "binary" below is a STAND-IN that replays a real NPB
# run recorded on this machine (tests/data/npb/README.md), installed under the name a
# user's directory would have, so the real hpcvm bench runs it under the real mpirun.

NPB_DATA = Path(__file__).resolve().parent.parent / "data" / "npb"


def _npb_dir(tmp_path: Path, name: str, recording: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / name
    stand_in.write_text(
        f"#!/bin/sh\nexec {sys.executable} {NPB_DATA / 'npb_standin.py'} "
        f"{NPB_DATA / 'real' / recording}\n"
    )
    stand_in.chmod(0o755)
    return bin_dir


def _npb(tmp_path: Path, bin_dir: Path, kernel: str, np_: int) -> subprocess.CompletedProcess[str]:
    return hpcvm(
        "bench", "--env", "native", "--suite", "npb", "--npb-dir", str(bin_dir),
        "--npb-kernels", kernel, "--np", str(np_), "--size", "quick", "--reps", "2",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip


def test_npb_verification_is_recorded_and_shown(tmp_path: Path) -> None:
    bin_dir = _npb_dir(tmp_path, "cg.S.x", "npb3.4-cg.S.x-np1")
    proc = _npb(tmp_path, bin_dir, "cg", 1)
    assert proc.returncode == 0, proc.stderr
    assert "verification SUCCESSFUL 2/2" in proc.stdout
    # class S prints 0.04 s in steps of 0.01 s: the resolution warning, said once in all
    # of bench's output, with advice in bench's own options
    said = (proc.stdout + proc.stderr).count("printed in steps of 0.01 s")
    assert said == 1, proc.stdout + proc.stderr
    assert "--size small, or --npb-kernels cg.W" in " ".join(proc.stdout.split())
    # each table says what it shows in NPB's terms, beside the stored metric name
    titles = [ln.strip() for ln in proc.stdout.splitlines() if "is better" in ln]
    assert any(t.startswith("npb:cg.S: Time_sec (CG time, s)") for t in titles), titles
    assert any(t.startswith("npb:cg.S: Mops_total (CG Mop/s, Mop/s)") for t in titles), titles
    rows = _rows(tmp_path / "r")
    assert {r["metric"] for r in rows} == {"Time_sec", "Mops_total"}
    assert all(r["facts"]["verification"] == "SUCCESSFUL 2/2" for r in rows)  # type: ignore[index]
    assert all(r["facts"]["class"] == "S" for r in rows)  # type: ignore[index]


@pytest.mark.parametrize(
    ("name", "recording", "kernel", "np_", "reason"),
    [
        ("cg.S.x", "npb3.4-cg.W.x-np1", "cg", 1, "class W"),  # a class-W binary named cg.S.x
        ("is.S.2", "npb3.3-is.S.1-np2", "is", 2, "compiled for 1 processes"),
        ("mg.S.1", "npb3.3-mg.S.2-np1", "mg", 1, "signal 11"),  # a crash
        ("cg.S.x", "npb3.4-cg.S.x-np1-wrong-reference", "cg", 1, "UNSUCCESSFUL"),
    ],
)
def test_npb_failures_name_their_reason(
    tmp_path: Path, name: str, recording: str, kernel: str, np_: int, reason: str
) -> None:
    if np_ > len(os.sched_getaffinity(0)):
        pytest.skip(f"needs {np_} CPUs")
    proc = _npb(tmp_path, _npb_dir(tmp_path, name, recording), kernel, np_)
    assert proc.returncode == 9, proc.stderr
    failed = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcvm: failed: native npb:")]
    assert failed and all(reason in ln for ln in failed), proc.stderr
    assert reason in one_line_error(proc)
    assert "FAILED" in proc.stdout and reason in " ".join(proc.stdout.split())
    rows = _rows(tmp_path / "r")
    assert rows and all(r["n"] == 0 and reason in str(r["failure_reason"]) for r in rows)
