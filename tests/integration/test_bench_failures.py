"""A failed sample is never silent (issue 16), with real processes: the real ``hpcvm
bench`` runs real commands that fail in each way a benchmark can, natively (a VM adds
nothing to how failures are counted: the same runner records them)."""

from __future__ import annotations

import json
import subprocess
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
