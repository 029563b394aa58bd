"""plan stage of the hpcvm pipeline (see DESIGN.md): ``plan(host, request) -> VMPlan``,
a pure function, and the five ``PROFILES`` it knows."""

from hpcvm.plan.planner import plan
from hpcvm.plan.profiles import PROFILES

__all__ = ["PROFILES", "plan"]
