"""`hpcvm bench` and `hpcvm results` end to end with the native environment and the cmd
suite (real commands, real database): refusals before anything starts, the JSON fields,
exports, and --resume bookkeeping."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from hpcvm.cli.main import main
from hpcvm.store import Store

REQUIRED = {
    "env",
    "suite",
    "metric",
    "unit",
    "higher_is_better",
    "np",
    "n",
    "mean",
    "ci_low",
    "ci_high",
    "overhead_pct",
    "overhead_ci_low",
    "overhead_ci_high",
    "significant",
    "accel",
    "cpu_model",
    "stop_reason",
    "warnings",
}
# Planned (not started): a 1-vCPU VM cannot run 2 ranks.
TOO_MANY_FOR_VM = [
    *("--env", "native", "--env", "vm:naive", "--vm-vcpus", "1"),
    *("--suite", "hpcc", "--np", "2", "--vm-memory", "256M"),
]
CMD = ["--cmd", "/bin/echo Time: 2.5 s", "--metric", r"Time: ([0-9.]+) s", "--lower-is-better"]


def _bench(out: Path, *extra: str) -> int:
    return main(["bench", "--env", "native", *CMD, "--out", str(out), *extra])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--env", "vm:fast", *CMD],
            "unknown environment 'vm:fast': choose from native, container, vm:naive",
        ),
        (["--env", "native", "--suite", "linpack"], "unknown suite 'linpack'"),
        (
            ["--env", "native", "--cmd", "/bin/true", "--metric", "(", "--lower-is-better"],
            "bad --metric regex",
        ),
        (["--env", "native", "--cmd", "/bin/true", "--lower-is-better"], "--cmd needs --metric"),
        (["--env", "native", "--suite", "npb", "--npb-dir", "/nonexistent/npb"], "does not exist"),
        (
            ["--env", "native", "--suite", "hpcc", "--np", "4096"],
            "--np 4096 is impossible in native",
        ),
        (["--env", "native", "--env", "native", *CMD], "listed twice"),
        (
            TOO_MANY_FOR_VM,
            "--np 2 is impossible in vm:naive: it has 1 vCPUs",
        ),
        (["--env", "native", *CMD, "--reps", "many"], "malformed --reps"),
        (["--env", "native", *CMD, "--target", "tight"], "malformed --target"),
    ],
)
def test_bad_requests_are_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "out"
    code = main(["bench", *args, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], err
    assert not out.exists()


def test_results_json_has_the_documented_fields_and_exports_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _bench(out, "--reps", "3", "--seed", "3") == 0
    printed = capsys.readouterr().out
    assert "cmd: value" in printed and "baseline" in printed

    assert main(["results", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    (row,) = rows
    assert set(row) >= REQUIRED
    assert (row["env"], row["suite"], row["metric"], row["np"]) == ("native", "cmd", "value", None)
    assert (row["n"], row["mean"]) == (3, 2.5)
    assert row["overhead_pct"] is None and row["significant"] is None
    assert row["accel"] == "native" and row["stop_reason"] == "fixed"

    for name in ("summary.json", "summary.csv", "samples.json", "samples.csv"):
        assert (out / name).is_file()
    with open(out / "samples.csv") as fh:
        lines = list(csv.DictReader(fh))
    assert [(r["warmup"], r["value"]) for r in lines] == [("True", "2.5")] + [("False", "2.5")] * 3
    assert json.loads((out / "summary.json").read_text()) == rows

    csv_file = tmp_path / "rows.csv"
    assert main(["results", str(out), "--csv", str(csv_file)]) == 0
    with open(csv_file) as fh:
        assert [r["mean"] for r in csv.DictReader(fh)] == ["2.5"]


def test_an_out_dir_with_a_run_needs_resume_and_the_same_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _bench(out, "--reps", "2", "--seed", "9") == 0
    capsys.readouterr()
    assert _bench(out, "--reps", "2") == 2
    assert "already holds the results of run 1" in capsys.readouterr().err

    other = ["bench", "--env", "native", "--cmd", "/bin/echo Time: 3 s", *CMD[2:]]
    assert main([*other, "--out", str(out), "--resume"]) == 2
    assert "made with different suite_options" in capsys.readouterr().err

    assert _bench(out, "--resume", "--seed", "10") == 2
    assert "used --seed 9" in capsys.readouterr().err

    # A finished run resumed: nothing runs again, the results are shown.
    assert main(["bench", "--resume", "--out", str(out)]) == 0
    assert "had already finished" in capsys.readouterr().err
    with Store.open(out) as store:
        assert len(store.samples(store.run().id)) == 3  # 1 warm-up + 2


def test_a_failed_run_shows_why_and_leaves_its_directory_to_a_new_run_or_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _bench(out, "--reps", "2", "--seed", "5") == 0
    with Store.open(out) as store:
        # Marked failed as a run that could not start an environment is (session.py).
        store.set_status(store.run().id, "failed", error="cannot make a cpuset of PUs 1")
    capsys.readouterr()
    assert main(["results", str(out)]) == 0
    assert "failed: cannot make a cpuset of PUs 1" in capsys.readouterr().out

    other = ["bench", "--env", "native", "--cmd", "/bin/echo Time: 3 s", *CMD[2:]]
    assert main([*other, "--out", str(out), "--resume"]) == 2
    assert "start a new run there without --resume" in capsys.readouterr().err
    assert main([*other, "--out", str(out), "--reps", "2"]) == 0  # a new run, same directory
    with Store.open(out) as store:
        first, second = store.runs()
        assert (first.status, second.status) == ("failed", "finished")
        assert [m.value for s in store.samples(second.id) for m in s.metrics] == [3.0] * 3
    capsys.readouterr()


def test_resume_with_more_reps_continues_the_same_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _bench(out, "--reps", "2", "--seed", "4") == 0
    with Store.open(out) as store:
        run = store.run()
        # Mark it interrupted, as Ctrl-C would have left it.
        store.set_status(run.id, "interrupted")
    assert main(["bench", "--resume", "--reps", "4", "--out", str(out)]) == 0
    with Store.open(out) as store:
        (again,) = store.runs()
        measured = store.samples(again.id, include_warmup=False)
        assert again.status == "finished" and again.seed == 4
        assert [s.repetition for s in measured] == [0, 1, 2, 3]
    capsys.readouterr()


def test_results_of_a_missing_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no results database" in err and len(err.splitlines()) == 1
    assert not os.path.exists(tmp_path / "none")
