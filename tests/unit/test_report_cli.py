"""``hpcvm report`` on the command line: where the files go, what it prints, and bad
input refused in one line with nothing left behind."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from hpcvm.cli.main import main
from tests.report_support import measured


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return measured(tmp_path_factory, "main")


def _printed_paths(out: str) -> dict[str, Path]:
    found = {}
    for line in out.splitlines():
        kind, _, path = line.partition(": ")
        if kind in ("html", "md", "json"):
            found[kind] = Path(path)
    return found


def test_report_writes_every_format_and_prints_where(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rep"
    argv = ["report", str(db), "--out", str(out)]
    assert main([*argv, "--format", "html", "--format", "md", "--format", "json"]) == 0
    captured = capsys.readouterr()
    paths = _printed_paths(captured.out)
    assert paths == {
        "html": out.absolute() / "report.html",
        "md": out.absolute() / "report.md",
        "json": out.absolute() / "report.json",
    }
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths.values())
    assert f"PNG files in {out.absolute() / 'figures'}" in captured.out
    assert "TCG (software emulation)" in captured.err  # the TCG warning, on stderr
    assert not list(out.rglob(".*.tmp"))


def test_default_is_html_in_results_report(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "results"
    copy.mkdir()
    with sqlite3.connect(db / "hpcvm.db") as src, sqlite3.connect(copy / "hpcvm.db") as dst:
        src.backup(dst)
    assert main(["report", str(copy)]) == 0
    assert _printed_paths(capsys.readouterr().out) == {
        "html": copy.absolute() / "report" / "report.html"
    }


def test_compare_prints_the_count_and_writes_compare_files(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(db), "--compare", str(db), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0 changed significantly" in out
    assert _printed_paths(out) == {"html": tmp_path.absolute() / "compare.html"}


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("hpcvm: error: ") and "Traceback" not in err
    return err


def test_missing_results_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rep"
    assert main(["report", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "does not exist" in _one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_directory_without_a_database_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "no results database" in _one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_database_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "hpcvm.db").write_text("not a database\n")
    assert main(["report", str(tmp_path)]) == 7
    assert "not a readable hpcvm results database" in _one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hpcvm.db"]
    assert (tmp_path / "hpcvm.db").read_text() == "not a database\n"


def test_out_that_is_a_file_is_refused_before_any_work(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "report.txt"
    target.write_text("mine\n")
    assert main(["report", str(db), "--out", str(target)]) == 2
    assert "not a directory" in _one_line_error(capsys)
    assert target.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]


def test_unknown_format_is_refused(db: Path, tmp_path: Path) -> None:
    assert main(["report", str(db), "--format", "pdf", "--out", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_report_files_get_the_umask_mode_like_the_results(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], umask: int
) -> None:
    """The report is read like the rest of the results (the user's group, a web
    server): its files get the mode any file created under the umask gets (the oracle:
    one the OS creates here under the same umask), not the 0600 of a temp file."""
    out = tmp_path / "rep"
    old = os.umask(umask)
    try:
        assert (
            main(["report", str(db), "--out", str(out), "--format", "html", "--format", "md"]) == 0
        )
        oracle = tmp_path / "oracle"
        oracle.write_text("x")
    finally:
        os.umask(old)
    capsys.readouterr()
    want = stat.S_IMODE(oracle.stat().st_mode)
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and all(stat.S_IMODE(p.stat().st_mode) == want for p in written), [
        (p.name, oct(stat.S_IMODE(p.stat().st_mode))) for p in written
    ]


@pytest.mark.parametrize("command", ["results", "report"])
@pytest.mark.parametrize("made", [False, True])
def test_a_directory_without_results_is_a_usage_error_for_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, made: bool
) -> None:
    """`results` and `report` name the same wrong directory the same way: README's exit
    code table lists it as a usage error (2), whether the directory exists or not."""
    given = tmp_path / "none"
    if made:
        given.mkdir()
    assert main([command, str(given)]) == 2
    _one_line_error(capsys)
    assert list(tmp_path.iterdir()) == ([given] if made else [])
