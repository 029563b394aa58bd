"""What ``verify`` reports: one ``Check`` per comparison, a ``VerifyReport`` per VM, and
what it needs of the guest agent. Shared by the checks of the plan (verify/vm.py), the
shares (verify/shares.py) and the NICs (verify/nics.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hpcvm.model import Frozen
from hpcvm.runtime.machine.model import ExecResult


class Check(Frozen):
    """One comparison: what the plan says, what was observed, and whether they agree."""

    name: str
    expected: str
    actual: str
    ok: bool
    detail: str = ""


class VerifyReport(Frozen):
    """Every check for one VM; ``ok`` only when all of them are."""

    vm: str
    checks: tuple[Check, ...]
    ok: bool

    @classmethod
    def of(cls, vm: str, checks: Sequence[Check]) -> VerifyReport:
        return cls(vm=vm, checks=tuple(checks), ok=all(c.ok for c in checks))

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)


class GuestExec(Protocol):
    """What verify needs of the guest agent (runtime.channels.agent.GuestAgent has it)."""

    def exec(self, argv: list[str], timeout: float | None = None) -> ExecResult: ...


def check(name: str, expected: object, actual: object, ok: bool, detail: str = "") -> Check:
    return Check(name=name, expected=str(expected), actual=str(actual), ok=ok, detail=detail)


# -- guest-side checks --------------------------------------------------------------------
