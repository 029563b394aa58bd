"""The cmd suite: any command, one metric read from its output with a regex.

``hpcvm bench --cmd './solver case1' --metric 'Time: ([0-9.eE+-]+) s' --lower-is-better``

The command is split like a shell would (``shlex``) but never run through one. It runs
from the directory the user was in when hpcvm started (relative paths in it mean what
the user meant), natively and in the guest alike: the guest sees the host's root, and
whatever the command writes there lands on the guest's tmpfs overlay. The regex must
have exactly one capture group, the number; the last match in stdout counts (a program
that prints progress prints its final figure last), else the last match in stderr.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcvm.bench.core.kind import SuiteKind, SuiteOptions
from hpcvm.bench.core.launch import ENV, Bind, mpirun_argv
from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError, parse_number, tail
from hpcvm.bench.core.suite import Suite, check_np_values, require_exit_ok
from hpcvm.bench.suites.cmd import FLAGS
from hpcvm.errors import UsageError
from hpcvm.model import Frozen


def compile_metric_pattern(pattern: str) -> re.Pattern[str]:
    """The user's metric regex, checked: it compiles and has exactly one group."""
    try:
        compiled = re.compile(pattern, re.MULTILINE)
    except re.error as exc:
        raise UsageError(f"bad --metric regex {pattern!r}: {exc}") from exc
    if compiled.groups != 1:
        raise UsageError(
            f"--metric regex {pattern!r} has {compiled.groups} capture groups; it needs "
            "exactly one, around the number, e.g. 'Time: ([0-9.eE+-]+) s' (use (?:...) "
            "for other groups)"
        )
    return compiled


def split_command(command: str) -> list[str]:
    """Split like a POSIX shell (quotes, escapes), without running one."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"cannot split --cmd {command!r}: {exc}") from exc
    if not argv:
        raise UsageError("--cmd is empty: give the command to benchmark")
    return argv


class CmdSuite:
    """A user's command and the one figure it prints."""

    output_files: tuple[str, ...] = ()

    def __init__(
        self,
        command: str,
        pattern: str,
        *,
        higher_is_better: bool,
        unit: str = "",
        metric_name: str = "value",
        name: str = "cmd",
        cwd: Path | None = None,
        mpi: bool = False,
        bind: Bind = "core",
    ) -> None:
        self.argv = split_command(command)
        self.pattern = compile_metric_pattern(pattern)
        if not metric_name.strip():
            raise UsageError("the cmd metric needs a name")
        self.metric = Metric(
            name=metric_name, unit=unit, higher_is_better=higher_is_better, description=command
        )
        self._name = name
        self.cwd = (cwd or Path.cwd()).absolute()
        self.mpi = mpi
        self.bind: Bind = bind

    @property
    def name(self) -> str:
        return self._name

    @property
    def uses_np(self) -> bool:
        return self.mpi

    @property
    def metrics(self) -> tuple[Metric, ...]:
        return (self.metric,)

    def program(self) -> str:
        """Absolute path of the command's program (PATH lookup, or relative to cwd);
        UsageError if it is not an executable file."""
        first = self.argv[0]
        if "/" in first:
            path = self.cwd / first
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
        else:
            found = shutil.which(first)
            if found:
                return str(Path(found).absolute())
        raise UsageError(f"--cmd program {first!r} is not an executable file (from {self.cwd})")

    def validate(self, np_values: Sequence[int]) -> None:
        if self.mpi:
            check_np_values(self.name, np_values)
        self.program()

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        # The user's directory, not workdir: the command's relative paths are the user's.
        argv = [self.program(), *self.argv[1:]]
        if self.mpi:
            argv = mpirun_argv(np, argv, bind=self.bind)
        return [ENV, "-C", str(self.cwd), *argv]

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        require_exit_ok(self.argv[0], exit_code, stdout, stderr)
        for stream in (stdout, stderr):
            matches = self.pattern.findall(stream)
            if matches:
                text = matches[-1]
                try:
                    return [self.metric.value(parse_number(text))]
                except ValueError as exc:
                    raise ParseError(
                        f"--metric regex captured {text!r}, which is not a number"
                    ) from exc
        raise ParseError(
            f"--metric regex {self.pattern.pattern!r} matched nothing in the output: "
            f"{tail(stdout, 2) or tail(stderr, 2) or 'no output'}"
        )


class CmdOptions(Frozen):
    """cmd's options (FLAGS) and the directory the user ran hpcvm from."""

    bind: Bind = "core"
    cmd: str | None = None
    metric: str | None = None  # regex with one group
    higher_is_better: bool | None = None  # None: the user has not said
    unit: str = ""
    metric_name: str = "value"
    cmd_cwd: Path | None = None  # default: the current directory
    cmd_mpi: bool = False


def _build(options: SuiteOptions) -> list[Suite]:
    o = options.typed(CmdOptions)
    if not o.cmd:
        raise UsageError("--suite cmd needs --cmd 'COMMAND ARGS'")
    if not o.metric:
        raise UsageError("--cmd needs --metric REGEX with one group around the number")
    if o.higher_is_better is None:
        raise UsageError("--cmd needs --lower-is-better or --higher-is-better")
    return [
        CmdSuite(
            o.cmd,
            o.metric,
            higher_is_better=o.higher_is_better,
            unit=o.unit,
            metric_name=o.metric_name,
            cwd=o.cmd_cwd,
            mpi=o.cmd_mpi,
            bind=o.bind,
        )
    ]


def _settle(values: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """A relative --cmd program means what it meant where the user was."""
    return values | {"cmd_cwd": str(cwd)} if values.get("cmd") else values


def _guest_dirs(options: SuiteOptions) -> list[Path]:
    """An absolute --cmd program's directory (a relative one lies under the working
    directory, which the guest sees)."""
    cmd = options.typed(CmdOptions).cmd
    if not cmd:
        return []
    program = Path(shlex.split(cmd)[0])
    return [program.parent] if program.is_absolute() else []


KIND = SuiteKind(
    "cmd",
    _build,
    "any command and a regex (--cmd, --metric)",
    flags=FLAGS,
    guest_dirs=_guest_dirs,
    settle=_settle,
)
