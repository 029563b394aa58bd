"""Statistics stage of the hpcvm pipeline (see DESIGN.md and METHOD.md): pure functions
over sequences of floats, no I/O. Results are frozen pydantic models."""

from hpcvm.stats.fieller import FiellerSet, fieller_set, welch_df
from hpcvm.stats.interleave import interleaved_order, interleaved_schedule
from hpcvm.stats.noise import NoiseSummary, detour_threshold_ns, noise_summary
from hpcvm.stats.overhead import Overhead, overhead
from hpcvm.stats.simulate import Coverage, Population, bootstrap_coverage, fieller_coverage
from hpcvm.stats.stopping import (
    Replay,
    StopDecision,
    fixed_width_stop,
    relative_half_width,
    replay_auto,
)
from hpcvm.stats.summary import DEFAULT_CONFIDENCE, Summary, summarize, t_quantile
from hpcvm.stats.timekeeping import DRIFT_LIMIT, Drift, clock_drift

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DRIFT_LIMIT",
    "Coverage",
    "Drift",
    "FiellerSet",
    "NoiseSummary",
    "Overhead",
    "Population",
    "Replay",
    "StopDecision",
    "Summary",
    "bootstrap_coverage",
    "clock_drift",
    "detour_threshold_ns",
    "fieller_coverage",
    "fieller_set",
    "fixed_width_stop",
    "interleaved_order",
    "interleaved_schedule",
    "noise_summary",
    "overhead",
    "relative_half_width",
    "replay_auto",
    "summarize",
    "t_quantile",
    "welch_df",
]
