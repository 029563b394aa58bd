"""plan stage of the hpcvm pipeline (see DESIGN.md): ``plan(host, request) -> VMPlan``,
a pure function, and the five ``PROFILES`` it knows."""

from typing import TYPE_CHECKING

from hpcvm.lazy import lazy_exports

if TYPE_CHECKING:
    from hpcvm.plan.planner import plan
    from hpcvm.plan.profiles import PROFILES

__all__ = [
    "PROFILES",
    "plan",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "hpcvm.plan.planner": ("plan",),
        "hpcvm.plan.profiles": ("PROFILES",),
    },
)
