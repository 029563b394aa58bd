"""A throw-away benchmark suite registered from outside hpcvm (tests/unit/test_plugins.py):
one module, one registry call. It runs /bin/echo and reads the number it printed: 42, or
what its own option ``--echo-number`` says (a plugin suite adds options as hpcvm's own
suites do, bench/core/flags.py)."""

from collections.abc import Sequence
from pathlib import Path

from hpcvm.bench.core.flags import SuiteFlag
from hpcvm.bench.core.metrics import Metric, MetricValue, ParseError
from hpcvm.bench.core.suite import Suite
from hpcvm.bench.suites.registry import SuiteKind, SuiteOptions, register

ANSWER = Metric(name="answer", unit="", higher_is_better=True, short="Answer")


class EchoSuite:
    name = "echo42"
    uses_np = False
    metrics = (ANSWER,)
    output_files: tuple[str, ...] = ()

    def __init__(self, number: int) -> None:
        self.number = number

    def validate(self, np_values: Sequence[int]) -> None:
        return None

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        return ["/bin/echo", str(self.number)]

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        if exit_code != 0 or not stdout.strip().isdigit():
            raise ParseError(f"echo42: unexpected output {stdout!r}")
        return [ANSWER.value(float(stdout))]


def _build(options: SuiteOptions) -> list[Suite]:
    return [EchoSuite(options.given("echo_number") or 42)]


NUMBER = SuiteFlag("--echo-number", "echo_number", "echo42: the number it prints.", kind=int)
register(
    SuiteKind("echo42", _build, "prints 42 (a test plugin)", metrics=(ANSWER,), flags=(NUMBER,))
)
