"""Results as a site's user meets them: reading another user's, reading a directory made
read-only, and writing where that user may not.

A real unprivileged user (cluster_support's test user, in groups hpcvm and kvm) runs
the node's ``hpcvm`` (a venv built with Debian's Python, as install-node.sh makes it):

- on another user's world-readable results (root's: made with the default umask) and on
  a ``chmod 0555`` directory of the user's own, ``results`` (tables, ``--json``,
  ``--csv``), ``report`` and ``report --compare`` exit 0 and show exactly what the
  owner sees (the oracle: the same commands run by root, who may write, on the same
  database; compared byte for byte), and the results directory is left as it was,
  every file's bytes and mtime;
- every path the user cannot write or read (in /root, /etc/passwd, the default ``--out``
  under an unwritable working directory, ``--csv`` there, the default report directory
  inside another user's results) is refused in one line naming it and the fix, with the
  documented exit code, and nothing is made.

The results are measured for real in seconds (tests/report_support.py: hpcvm-noise and
dd, natively and under nice).
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from hpcvm.cli.main import main
from tests import cluster_support
from tests.cluster_support import TEST_UID, TEST_USER
from tests.report_support import measure_database
from tests.users import remove_user

pytestmark = pytest.mark.integration

QUICK_NATIVE = ["--env", "native", "--suite", "noise", "--reps", "2", "--size", "quick"]


@pytest.fixture(scope="module")
def user() -> Iterator[str]:
    """The test user (scripts/test-cluster.sh makes it; made here the same way, and
    removed again, where it is missing)."""
    try:
        pwd.getpwnam(TEST_USER)
        yield TEST_USER
        return
    except KeyError:
        pass
    groups = [g for g in (cluster_support.SITE_GROUP, "kvm") if _group_exists(g)]
    subprocess.run(
        ["useradd", "--uid", str(TEST_UID), "--user-group", "--create-home", "--shell",
         "/bin/sh", *(["--groups", ",".join(groups)] if groups else []), TEST_USER],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield TEST_USER
    finally:
        remove_user(TEST_USER)


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="module")
def hpcvm(user: str) -> str:
    return str(cluster_support.build_user_hpcvm(cluster_support.USER_VENV_HOME, user))


@pytest.fixture(scope="module")
def place() -> Iterator[Path]:
    """A directory under /var/tmp every user may enter (pytest's is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="hpcvm-shared-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    for sub in path.rglob("*"):  # a 0555 directory inside holds rmtree up
        if sub.is_dir():
            sub.chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def others(place: Path) -> Path:
    """Root's results, made with the default umask: readable by all, writable by root."""
    old = os.umask(0o022)
    try:
        return measure_database(
            place / "root-results",
            envs=("native", "native-nice19"),
            cells=(("noise", None), ("cmd", 1)),
        )
    finally:
        os.umask(old)


@pytest.fixture(scope="module")
def frozen(others: Path, place: Path) -> Path:
    """The user's own copy of those results in a directory made read-only (0555)."""
    path = place / "frozen"
    path.mkdir()
    # closed at once: a connection left open would keep journal files beside the
    # database, which a reader could use instead of reading the file alone
    source, copy = sqlite3.connect(others / "hpcvm.db"), sqlite3.connect(path / "hpcvm.db")
    with closing(source), closing(copy):
        source.backup(copy)
    assert sorted(p.name for p in others.iterdir()) == ["hpcvm.db", "work"]
    for p in (path, path / "hpcvm.db"):
        os.chown(p, TEST_UID, TEST_UID)
    path.chmod(0o555)
    return path


@pytest.fixture
def own(user: str) -> Iterator[Path]:
    """A working directory the user owns."""
    with cluster_support.user_dir("hpcvm-own-") as path:
        yield path


def run_as(user: str, cwd: Path | str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` as ``user`` from ``cwd``."""
    return cluster_support.as_user(["sh", "-c", 'cd "$0" && exec "$@"', str(cwd), *argv], user)


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


@pytest.mark.parametrize("which", ["another user's", "a 0555 directory"])
def test_a_user_reads_results_they_cannot_write_as_their_owner_sees_them(
    hpcvm: str,
    user: str,
    own: Path,
    others: Path,
    frozen: Path,
    which: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = str(others if which == "another user's" else frozen)
    before = snapshot(Path(results))
    tables = ok(run_as(user, own, hpcvm, "results", results))
    as_json = ok(run_as(user, own, hpcvm, "results", results, "--json"))
    ok(run_as(user, own, hpcvm, "results", results, "--csv", "summary.csv"))
    ok(run_as(user, own, hpcvm, "report", results, "--out", "rep", "--format", "json"))
    compared = ok(run_as(user, own, hpcvm, "report", results, "--compare", str(others),
                         "--out", "cmp", "--format", "json"))  # fmt: skip
    assert snapshot(Path(results)) == before  # not a byte, no journal file
    # the oracle: root, who may write, runs the same on the same database (in this
    # process: no second start of Python per command)
    root = Path(tempfile.mkdtemp(dir=own))
    assert main(["results", results, "--json"]) == 0
    assert as_json == capsys.readouterr().out
    assert main(["results", results, "--csv", str(root / "summary.csv")]) == 0
    assert (own / "summary.csv").read_text() == (root / "summary.csv").read_text()
    assert main(["report", results, "--out", str(root / "rep"), "--format", "json"]) == 0
    assert (own / "rep" / "report.json").read_bytes() == (root / "rep" / "report.json").read_bytes()
    assert compared.startswith("compared ") and "0 changed significantly" in compared
    rows = json.loads(as_json)
    assert {r["env"] for r in rows} == {"native", "native-nice19"}
    assert "run 1: conditions" in tables
    assert all(f"{r['env']} " in tables for r in rows)


def _refusals(others: Path) -> list[tuple[str, list[str], int, str, Path | None]]:
    """(cwd, argv, exit code, what the line says, a path that must not appear)."""
    return [
        ("own", ["bench", "--out", "/root/rx", *QUICK_NATIVE], 2, "may not enter /root", None),
        ("own", ["bench", "--out", "/etc/passwd", *QUICK_NATIVE], 2,
         "/etc/passwd exists and is not a directory", None),
        ("/usr/share", ["bench", *QUICK_NATIVE], 2,
         "the working directory /usr/share is not writable by this user",
         Path("/usr/share/results")),
        ("own", ["bench", "--out", str(others), *QUICK_NATIVE], 2,
         f"{others} is not writable by this user, owner root", others / "hpcvm.lock"),
        ("own", ["results", str(others), "--csv", "/root/x.csv"], 2, "may not enter /root",
         Path("/root/x.csv")),
        ("/usr/share", ["results", str(others), "--csv", "x.csv"], 2,
         "cannot write /usr/share/x.csv", Path("/usr/share/x.csv")),
        ("own", ["report", str(others), "--out", "/root/rep"], 2, "may not enter /root",
         Path("/root/rep")),
        ("own", ["report", str(others)], 2, f"cannot write {others}/report", others / "report"),
        ("own", ["results", "/root/r3"], 7, "/root may not be entered", None),
    ]  # fmt: skip


def test_paths_a_user_cannot_use_are_refused_in_one_line_leaving_nothing(
    hpcvm: str, user: str, own: Path, others: Path
) -> None:
    before = snapshot(others)
    for cwd, argv, code, says, absent in _refusals(others):
        proc = run_as(user, own if cwd == "own" else cwd, hpcvm, *argv)
        what = " ".join(argv)
        assert proc.returncode == code, f"{what}: {proc.returncode} {proc.stderr}"
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hpcvm: error: "), f"{what}: {lines}"
        assert says in lines[0], f"{what}: {lines[0]}"
        assert proc.stdout == ""
        assert absent is None or not absent.exists(), f"{what} left {absent}"
        assert list(own.iterdir()) == [], f"{what} left {list(own.iterdir())}"
    assert snapshot(others) == before


def test_a_noise_sample_the_user_may_not_read_is_left_out_and_said(
    hpcvm: str, user: str, own: Path, place: Path
) -> None:
    """Another user's results whose one noise work directory is private (0700): the
    report still draws the rest and says what it could not read."""
    results = measure_database(place / "private-work", envs=("native",), cells=(("noise", None),))
    hidden = sorted(results.glob("work/native-noise-None-*"))[-1]
    hidden.chmod(0o700)
    ok(run_as(user, own, hpcvm, "report", str(results), "--out", "rep", "--format", "json"))
    report = json.loads((own / "rep" / "report.json").read_text())["report"]
    assert report["notes"] == [
        "native: raw noise durations of 1 noise sample(s) cannot be read (their work "
        "directory no longer holds noise-raw.txt, or this user may not read it); the detour "
        "distribution uses the rest"
    ]
    assert [curve["env"] for curve in report["noise"]] == ["native"]
