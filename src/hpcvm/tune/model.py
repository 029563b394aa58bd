"""What the tuning works on (a target), what a check finds (rows), what apply writes
(changes) and what it saves first (the saved state)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpcvm.model import Frozen

When = Literal["runtime", "boot"]
STATE_SCHEMA_VERSION = 1


class TuneTarget(Frozen):
    """The PUs to keep quiet and the PUs that take the host's housekeeping instead.

    Built and validated by ``hpcvm.tune.target``: both sets non-empty, disjoint, online.
    """

    vcpu_pus: tuple[int, ...]
    housekeeping_pus: tuple[int, ...]
    hugetlbfs: bool = False  # guest RAM on hugetlbfs: THP only has to stay out of the way
    source: str  # where the sets came from, for people ("VM vm1", "plan p.json", ...)

    def isolated_pus(self) -> tuple[int, ...]:
        """The PUs isolated at boot (isolcpus, nohz_full, rcu_nocbs): the vCPU PUs but
        CPU 0, the kernel's boot CPU, which keeps timekeeping and the interrupts that
        cannot move (a VM pinned there is quieted at run time only)."""
        from hpcvm.plan.tuning import isolatable

        return tuple(isolatable(self.vcpu_pus, self.housekeeping_pus))


class Row(Frozen):
    """One setting as ``--check`` shows it. ``ok`` is None when the host lacks it."""

    name: str
    when: When
    what: str
    wanted: str
    has: str
    ok: bool | None
    note: str = ""


class Change(Frozen):
    """One file write that apply would do, with what restores it.

    ``before`` is the file's exact text now; ``restore`` is what to write to get that
    text back (often ``before`` stripped; for THP the bracketed choice only).
    ``may_refuse``: the kernel may refuse (EIO, EPERM: an IRQ it will not move), which
    is reported and skipped, not a failure.
    """

    setting: str
    path: str
    before: str
    value: str
    restore: str
    may_refuse: bool = False


class SavedState(Frozen):
    """What ``--apply`` wrote to disk before changing anything; ``--revert`` undoes
    ``changes`` in reverse order. The entry for a write is saved before the write, so
    after a crash the file may list one change that never happened: restoring it
    writes back the value that is already there."""

    schema_version: int = STATE_SCHEMA_VERSION
    target: TuneTarget
    started: str
    pid: int
    complete: bool = False  # False: apply was interrupted (crash) before it finished
    changes: tuple[Change, ...] = ()
    refused: tuple[str, ...] = Field(
        default=(), description="paths the kernel refused (EIO, EPERM)"
    )
