"""cmd suite: a user's command and a regex with one group around the number."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.bench.core.metrics import ParseError
from hpcvm.bench.suites.cmd.suite import CmdSuite, compile_metric_pattern, split_command
from hpcvm.errors import UsageError

PATTERN = r"Time: ([0-9.eE+-]+) s"


def suite(**kwargs: object) -> CmdSuite:
    options: dict[str, object] = {"higher_is_better": False, "unit": "s"}
    options.update(kwargs)
    return CmdSuite("/bin/echo Time: 1.5 s", PATTERN, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("Time: ([0-9.]+", "bad --metric regex 'Time: \\(\\[0-9.\\]\\+'"),
        ("Time: [0-9.]+ s", "has 0 capture groups"),
        ("(Time): ([0-9.]+) s", "has 2 capture groups"),
    ],
)
def test_bad_regex_is_a_usage_error_naming_it(pattern: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        compile_metric_pattern(pattern)
    with pytest.raises(UsageError):
        CmdSuite("/bin/true", pattern, higher_is_better=True)


def test_non_capturing_groups_are_allowed() -> None:
    assert compile_metric_pattern(r"(?:Time|Elapsed): ([0-9.]+)").groups == 1


@pytest.mark.parametrize("command", ["", "   ", "echo 'unbalanced"])
def test_bad_command_is_a_usage_error(command: str) -> None:
    with pytest.raises(UsageError):
        split_command(command)


def test_command_is_split_like_a_shell_without_one() -> None:
    assert split_command("./solver 'case 1' --n=3") == ["./solver", "case 1", "--n=3"]


def test_last_match_in_stdout_counts() -> None:
    out = "Time: 9.0 s (warm-up)\nTime: 1e-05 s\n"
    (value,) = suite().parse(Path("/tmp"), out, "Time: 7 s", 0)
    assert value.value == 1e-05
    assert value.metric.unit == "s" and value.metric.higher_is_better is False


def test_stderr_is_searched_when_stdout_has_no_match() -> None:
    (value,) = suite().parse(Path("/tmp"), "nothing here", "Time: 42 s\n", 0)
    assert value.value == 42


def test_no_match_is_a_failed_sample() -> None:
    with pytest.raises(ParseError, match=r"matched nothing.*solver says hello"):
        suite().parse(Path("/tmp"), "solver says hello\n", "", 0)


def test_captured_text_that_is_no_number_is_a_failed_sample() -> None:
    wide = CmdSuite("/bin/true", r"Time: (\S+)", higher_is_better=False)
    with pytest.raises(ParseError, match="'fast'"):
        wide.parse(Path("/tmp"), "Time: fast\n", "", 0)


def test_nonzero_exit_is_a_failed_sample() -> None:
    with pytest.raises(ParseError, match="exited with code 3"):
        suite().parse(Path("/tmp"), "Time: 1 s", "oops", 3)


def test_relative_program_resolved_from_the_users_directory(tmp_path: Path) -> None:
    program = tmp_path / "solver"
    program.write_text("#!/bin/sh\necho Time: 2 s\n")
    program.chmod(0o755)
    cmd = CmdSuite("./solver case1", PATTERN, higher_is_better=False, cwd=tmp_path)
    cmd.validate([1])
    argv = cmd.prepare(tmp_path / "work", 1, 0)
    assert argv == ["/usr/bin/env", "-C", str(tmp_path), str(program), "case1"]


def test_missing_program_is_a_usage_error(tmp_path: Path) -> None:
    cmd = CmdSuite("./nope", PATTERN, higher_is_better=False, cwd=tmp_path)
    with pytest.raises(UsageError, match=r"'\./nope' is not an executable file"):
        cmd.validate([1])
    on_path = CmdSuite("no-such-program-hpcvm", PATTERN, higher_is_better=False)
    with pytest.raises(UsageError):
        on_path.validate([1])


def test_program_on_path_becomes_absolute() -> None:
    argv = CmdSuite("echo hi", PATTERN, higher_is_better=True).prepare(Path("/tmp/w"), 1, 0)
    assert Path(argv[3]).is_absolute() and Path(argv[3]).name == "echo"


def test_mpi_command_goes_through_mpirun_and_uses_np() -> None:
    cmd = suite(mpi=True)
    assert cmd.uses_np and not suite().uses_np
    argv = cmd.prepare(Path("/tmp/w"), 2, 0)
    assert "mpirun" in Path(argv[3]).name
    assert argv[argv.index("-np") + 1] == "2"
    with pytest.raises(UsageError):
        cmd.validate([0])
