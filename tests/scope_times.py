"""Where the integration tests' time goes, by scope and worker (issue 35).

With ``--dist loadscope`` (scripts/test.sh's integration tests) the run's wall time is
that of its busiest worker, and a worker's time is the sum of the scopes it ran: a
module, or a shared-state group of tests/shared_state.py. pytest's ``--durations``
names slow tests but not which worker they held, so the end of the run prints, per
scope, its worker, its tests' summed time and its span from first start to last stop,
and per worker its span; a shared-state group's modules are listed under it, and the
unit modules (short, and many) summed per worker. The controller sees every worker's
reports, so this runs there.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest

from tests.shared_state import scope_of

UNIT = "tests/unit/"  # scripts/test.sh runs the unit tests in the same run


@dataclass
class ScopeTime:
    """One scope's reports as they came: who ran it, how long its phases took."""

    worker: str = "-"
    seconds: float = 0.0
    first: float = float("inf")
    last: float = 0.0
    tests: set[str] = field(default_factory=set)

    def add(self, report: pytest.TestReport, worker: str) -> None:
        self.worker = worker
        self.seconds += report.duration
        self.first = min(self.first, report.start)
        self.last = max(self.last, report.stop)
        self.tests.add(report.nodeid)


class ScopeTimes:
    """The pytest plugin: collects reports, prints the table at the end."""

    def __init__(self) -> None:
        self.scopes: dict[str, ScopeTime] = defaultdict(ScopeTime)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else "main"
        scope = scope_of(report.nodeid)
        if scope.startswith(UNIT):  # many short modules: one row per worker
            scope = f"{UNIT}* (the unit modules {worker} ran)"
        self.scopes[scope].add(report, worker)
        module = report.nodeid.split("::", 1)[0]
        # a group's modules too, indented under it
        if module != scope and not module.startswith(UNIT):
            self.scopes[f"{scope} > {module}"].add(report, worker)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.scopes:
            return
        write = terminalreporter.write_line
        terminalreporter.section("time by scope and worker (issue 35)")
        start = min(s.first for s in self.scopes.values())
        rows = sorted(self.scopes.items(), key=lambda kv: (kv[1].worker, kv[1].first))
        write(f"{'worker':<7} {'from':>6} {'to':>6} {'summed':>7} {'tests':>5}  scope")
        for name, scope in rows:
            write(
                f"{scope.worker:<7} {scope.first - start:6.0f} {scope.last - start:6.0f} "
                f"{scope.seconds:7.0f} {len(scope.tests):5d}  {name}"
            )
        for worker in sorted({s.worker for s in self.scopes.values()}):
            mine = [s for n, s in self.scopes.items() if s.worker == worker and " > " not in n]
            busy = sum(s.seconds for s in mine)
            end = max(s.last for s in mine) - start
            write(f"{worker}: busy {busy:.0f} s, last test ended {end:.0f} s after the first")
