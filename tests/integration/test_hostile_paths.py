"""Every hpcvm command, run by a user of a site's node, given hostile paths.

The walk takes the commands from ``hpcvm --help`` and each group's ``--help`` (so a new
command is walked without touching this file), and each command's path-taking options
and arguments from the command itself (a ``click.Path``, or a text option whose help or
name says it is a file or directory). Each such path is given, in turn, as something
the user cannot read (``/root/x``), a directory they cannot write, a path that does not
exist (and cannot be made), a file where a directory is wanted (and a directory where a
file is), and another user's private directory; and hpcvm's runtime directory itself
(``HPCVM_RUNTIME_DIR``, and the default location under ``XDG_RUNTIME_DIR``) is given as
each of them to every command.

Each run, as the unprivileged test user (groups hpcvm and kvm), runs the user's
installed hpcvm's own ``main`` in a process forked for it from one that imported hpcvm
once (tests/hostile_driver.py: a process per case, without a second of imports each).
It must end with a documented exit code (README "Exit codes": 2-10, 124, 130; 0 where
the path is fine for that command), no traceback, nothing on stderr but warnings and
one ``hpcvm: error:`` line, which is not the CLI's last resort for an OSError (that
names the path, not the option and the fix), and nothing new or gone at the hostile
paths, in the runtime directory or in the working directory. Most cases are refused
before anything is planned or started; a case that would boot a VM must be refused
first, which is the point, so the walk is fast (under a minute).

Oracles independent of hpcvm: the exit status, stderr's text, and lstat(2) of every
path under the test's directories before and after each run. Real users (the test user,
``nobody`` as the other user), real permissions, the installed ``hpcvm`` the test user
runs (tests/cluster_support.py ``build_user_hpcvm``).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from _pytest.mark import ParameterSet

from hpcvm.cli.main import OS_ERROR_FIX
from tests import cluster_support
from tests.users import remove_user

pytestmark = pytest.mark.integration

DOCUMENTED = frozenset({*range(2, 11), 124, 130})  # README "Exit codes", besides 0
KINDS = ("unreadable", "unwritable", "missing", "file", "foreign")
OTHER_USER = "nobody"
CASE_TIMEOUT = 60  # seconds; a refusal takes a fraction of one
PLAIN_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", f"HOME=/home/{cluster_support.TEST_USER}")
# A text option or argument is a path when its help or its name says so.
_PATH_HELP = re.compile(r"\b(director(y|ies)|files?|paths?|kernel|initramfs|image)\b", re.I)
_PATH_NAME = re.compile(r"(^|_)(dir|directory|path|file|results)$")
# Values for the parameters that are not the path under test: these wherever a command
# has them (what a VM needs), else every argument and required option by its type.
_GIVEN = {
    "name": "hh1",
    "profile": "naive",
    "memory": "256M",
    "vcpus": "1",
    "address": "10.9.0.1/24",
    "node": "node1",
    "to": "node2",
    "batch": "local",  # cluster up on this machine: no Slurm allocation here
}
# A path that takes the place of the VM's options (a saved job has them): given alone.
_ALONE = frozenset({"restore"})
# Failures in code another engineer owns (issue 36), expected until fixed there (then
# strict xfail fails: unmark them); the key is the case's id, as pytest prints it.
OWNED_ELSEWHERE: dict[str, str] = {}


# -- what to walk -----------------------------------------------------------------------


def _help(*words: str) -> str:
    """``hpcvm WORDS --help`` as it prints, run in this process (click's runner): the
    walk is collected at every test run, and 25 interpreters took 9 s."""
    from click.testing import CliRunner

    from hpcvm.cli.main import cli

    result = CliRunner().invoke(cli, [*words, "--help"], prog_name="hpcvm")
    assert result.exit_code == 0, result.output
    return result.output


def _listed(help_text: str) -> list[str]:
    """The command names of a help text's "Commands:" section."""
    section = help_text.partition("\nCommands:\n")[2]
    return [m.group(1) for m in re.finditer(r"^  (\S+)  ", section, re.M)]


def commands() -> list[tuple[str, ...]]:
    """Every command and subcommand, as ``hpcvm --help`` and each group's help list them."""
    walked: list[tuple[str, ...]] = []
    pending: list[tuple[str, ...]] = [(name,) for name in _listed(_help())]
    while pending:
        words = pending.pop(0)
        inner = _listed(_help(*words))
        if inner:
            pending += [(*words, name) for name in inner]
        else:
            walked.append(words)
    return walked


def _command(words: tuple[str, ...]) -> click.Command:
    from hpcvm.cli.main import cli

    command: click.Command = cli
    for word in words:
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), word)
        assert found is not None, words
        command = found
    return command


def is_path(param: click.Parameter) -> bool:
    if isinstance(param.type, click.Path):
        return True
    if type(param.type) is not click.types.StringParamType:
        return False
    help_text = getattr(param, "help", None) or ""
    return bool(_PATH_HELP.search(help_text) or _PATH_NAME.search(param.name or ""))


@dataclass(frozen=True)
class Case:
    words: tuple[str, ...]  # the command
    param: str | None  # the path parameter under test; None: the runtime directory
    kind: str  # one of KINDS, or "xdg-foreign"

    @property
    def id(self) -> str:
        return f"{' '.join(self.words)}|{self.param or 'runtime-dir'}|{self.kind}"


def cases() -> list[Case]:
    found: list[Case] = []
    for words in commands():
        params = [p.name for p in _command(words).params if is_path(p) and p.name]
        for param in params:
            found += [Case(words, param, kind) for kind in KINDS]
        found += [Case(words, None, kind) for kind in (*KINDS, "xdg-foreign")]
    return found


def _param(case: Case) -> ParameterSet:
    reason = OWNED_ELSEWHERE.get(case.id)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(case, id=case.id, marks=marks)


CASES = [_param(case) for case in cases()]


# -- the hostile places -----------------------------------------------------------------


@dataclass(frozen=True)
class Places:
    base: Path  # root's, 0755: everything below is watched
    ro: Path  # a directory of root's the user may read, not write (also the cwd)
    foreign: Path  # another user's private directory
    neutral: Path  # the user's own empty directory, for other required paths
    runtime: Path  # the user's own runtime directory for the runs
    xdg: Path  # an XDG_RUNTIME_DIR whose hpcvm/ another user made

    def value(self, kind: str) -> str:
        return str(
            {
                "unreadable": Path("/root/x"),
                "unwritable": self.ro,
                "missing": self.ro / "missing",
                "file": self.ro / "file",
                "foreign": self.foreign,
            }[kind]
        )


@pytest.fixture(scope="module")
def test_user() -> Iterator[str]:
    """The test user, made as scripts/test-cluster.sh makes it when absent (same ids,
    groups and mark, so the script's own ``down`` recognises it); removed afterwards
    only if made here."""
    user = cluster_support.TEST_USER
    try:
        pwd.getpwnam(user)
        made = False
    except KeyError:
        made = True
        groups = [g for g in (cluster_support.SITE_GROUP, "kvm") if _group_exists(g)]
        if not _group_exists(str(cluster_support.TEST_UID)):
            _root("groupadd", "--gid", str(cluster_support.TEST_UID), user)
        _root("useradd", "--uid", str(cluster_support.TEST_UID), "--gid",
              str(cluster_support.TEST_UID), "--groups", ",".join(groups), "--create-home",
              "--home-dir", f"/home/{user}", "--shell", "/bin/sh", "--comment",
              "hpcvm test cluster user (scripts/test-cluster.sh)", user)  # fmt: skip
    try:
        yield user
    finally:
        if made:
            remove_user(user)


def _group_exists(name: str) -> bool:
    return subprocess.run(["getent", "group", name], capture_output=True).returncode == 0


def _root(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def hpcvm(test_user: str) -> str:
    return str(cluster_support.build_user_hpcvm(user=test_user))


@pytest.fixture(scope="module")
def places(test_user: str) -> Iterator[Places]:
    user = pwd.getpwnam(test_user)
    other = pwd.getpwnam(OTHER_USER)
    base = Path(tempfile.mkdtemp(prefix="hpcvm-hostile-", dir="/var/tmp"))
    base.chmod(0o755)
    ro = base / "ro"
    ro.mkdir(mode=0o755)
    (ro / "file").write_text("not what any option wants\n")
    foreign = base / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, other.pw_uid, other.pw_gid)
    mine = []
    for name in ("neutral", "runtime", "xdg"):
        (base / name).mkdir(mode=0o700)
        os.chown(base / name, user.pw_uid, user.pw_gid)
        mine.append(base / name)
    (base / "xdg" / "hpcvm").mkdir(mode=0o755)
    os.chown(base / "xdg" / "hpcvm", other.pw_uid, other.pw_gid)
    try:
        yield Places(base, ro, foreign, mine[0], mine[1], mine[2])
    finally:
        shutil.rmtree(base, ignore_errors=True)


def snapshot(places: Places) -> dict[str, tuple[int, int, int]]:
    """Every path under the test's directories (and /root/x) with its mode, owner and
    size: what a run must leave as it found."""
    seen = {}
    for top in (places.base, Path("/root/x")):
        if not os.path.lexists(top):
            continue
        for path in [top, *top.rglob("*")]:
            st = path.lstat()
            seen[str(path)] = (st.st_mode, st.st_uid, st.st_size if path.is_file() else 0)
    return seen


# -- one run ----------------------------------------------------------------------------


def argv_for(case: Case, places: Places) -> tuple[list[str], dict[str, str]]:
    """The command line of ``case`` and the environment besides the user's plain one."""
    command = _command(case.words)
    # A guest cache that cannot be made: no case spends minutes building a guest (the
    # site's, where the node install built one, is used as it is).
    env = {"HPCVM_CACHE": str(places.ro / "cache"), "HPCVM_RUNTIME_DIR": str(places.runtime)}
    if case.param is None and case.kind == "xdg-foreign":
        del env["HPCVM_RUNTIME_DIR"]
        env["XDG_RUNTIME_DIR"] = str(places.xdg)
    elif case.param is None:
        env["HPCVM_RUNTIME_DIR"] = places.value(case.kind)
    options: list[str] = []
    positional: list[str] = []
    rest: list[str] = []
    for param in command.params:
        if param.name == case.param:
            value = places.value(case.kind) + (":rw" if param.name == "shares" else "")
        elif _given(param, case):
            value = _given_value(param, places)
        else:
            continue
        if isinstance(param.type, click.types.UnprocessedParamType):
            rest = ["--", "true"]
        elif isinstance(param, click.Option):
            options += [param.opts[0], value]
        else:
            positional.append(value)
    return [*case.words, *options, *positional, *rest], env


def _given(param: click.Parameter, case: Case) -> bool:
    """Whether ``case`` gives ``param`` a value of its own (``_given_value``)."""
    if param.required or isinstance(param, click.Argument):
        return True
    return param.name in _GIVEN and (case.param not in _ALONE or param.name == "batch")


def _given_value(param: click.Parameter, places: Places) -> str:
    if is_path(param):
        return str(places.neutral / "new")  # the user could make it: it must stay unmade
    if param.name in _GIVEN:
        return _GIVEN[param.name]
    if isinstance(param.type, click.Choice):
        return str(param.type.choices[0])
    if isinstance(param.type, click.types.IntParamType | click.types.FloatParamType):
        return "1"
    return "x"


class Driver:
    """tests/hostile_driver.py, running as the test user: one fork per case."""

    def __init__(self, hpcvm: str) -> None:
        source = (Path(__file__).resolve().parent.parent / "hostile_driver.py").read_text()
        python = str(Path(hpcvm).parent / "python")
        self.proc = subprocess.Popen(
            ["runuser", "-u", cluster_support.TEST_USER, "--", "env", "-i", *PLAIN_ENV,
             python, "-c", source],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert json.loads(ready or "{}").get("ready"), "the driver did not start"

    def run(self, argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        plain = dict(item.split("=", 1) for item in PLAIN_ENV)
        request = {"argv": argv, "env": {**plain, **env}, "cwd": str(cwd),
                   "timeout": CASE_TIMEOUT}  # fmt: skip
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        return int(answer["rc"]), str(answer["stderr"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def driver(hpcvm: str) -> Iterator[Driver]:
    running = Driver(hpcvm)
    try:
        yield running
    finally:
        running.close()


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_path_is_refused_in_one_line(case: Case, driver: Driver, places: Places) -> None:
    before = snapshot(places)
    argv, env = argv_for(case, places)
    rc, stderr = driver.run(argv, env, places.ro)
    shown = f"hpcvm {' '.join(argv)} ({env})\nrc={rc}\n{stderr}"
    assert "Traceback" not in stderr, shown
    errors = [ln for ln in stderr.splitlines() if not ln.startswith("hpcvm: warning:")]
    if case.words == ("guest", "info") and rc == 1:  # README: nothing cached, as grep's 1
        assert len(errors) == 1 and errors[0].startswith("no current guest image"), shown
        rc = 0
    assert rc in DOCUMENTED | {0}, shown
    if rc != 0:
        assert len(errors) == 1 and errors[0].startswith("hpcvm: error: "), shown
        assert not errors[0].endswith(OS_ERROR_FIX), f"refused only by the last resort: {shown}"
    after = snapshot(places)
    assert {p: after[p] for p in after.keys() - before.keys()} == {}, shown
    assert {p: before[p] for p in before.keys() - after.keys()} == {}, shown
