"""Statistics stage of the hpcvm pipeline (see DESIGN.md and METHOD.md): pure functions
over sequences of floats, no I/O. Results are frozen pydantic models."""

from typing import TYPE_CHECKING

from hpcvm.lazy import lazy_exports

if TYPE_CHECKING:
    from hpcvm.stats.fieller import FiellerSet, fieller_set, welch_df
    from hpcvm.stats.interleave import interleaved_order, interleaved_schedule
    from hpcvm.stats.noise import NoiseSummary, detour_threshold_ns, noise_summary
    from hpcvm.stats.outliers import MIN_FLAG_N, flag_outliers, outlier_count, outlier_threshold
    from hpcvm.stats.overhead import Overhead, OverheadMethod, overhead
    from hpcvm.stats.robust import robust_overhead
    from hpcvm.stats.simulate import (
        Coverage,
        Population,
        bootstrap_coverage,
        fieller_coverage,
        robust_coverage,
        true_median_ratio,
    )
    from hpcvm.stats.stopping import (
        Replay,
        StopDecision,
        fixed_width_stop,
        relative_half_width,
        replay_auto,
    )
    from hpcvm.stats.summary import DEFAULT_CONFIDENCE, Summary, summarize, t_quantile
    from hpcvm.stats.timekeeping import DRIFT_LIMIT, Drift, clock_drift
    from hpcvm.stats.trust import Trust, TrustIssue, TrustKind, overhead_trust, sample_trust

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DRIFT_LIMIT",
    "MIN_FLAG_N",
    "Coverage",
    "Drift",
    "FiellerSet",
    "NoiseSummary",
    "Overhead",
    "OverheadMethod",
    "Population",
    "Replay",
    "StopDecision",
    "Summary",
    "Trust",
    "TrustIssue",
    "TrustKind",
    "bootstrap_coverage",
    "clock_drift",
    "detour_threshold_ns",
    "fieller_coverage",
    "fieller_set",
    "fixed_width_stop",
    "flag_outliers",
    "interleaved_order",
    "interleaved_schedule",
    "noise_summary",
    "outlier_count",
    "outlier_threshold",
    "overhead",
    "overhead_trust",
    "relative_half_width",
    "replay_auto",
    "robust_coverage",
    "robust_overhead",
    "sample_trust",
    "summarize",
    "t_quantile",
    "true_median_ratio",
    "welch_df",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "hpcvm.stats.fieller": ("FiellerSet", "fieller_set", "welch_df"),
        "hpcvm.stats.interleave": ("interleaved_order", "interleaved_schedule"),
        "hpcvm.stats.noise": ("NoiseSummary", "detour_threshold_ns", "noise_summary"),
        "hpcvm.stats.outliers": (
            "MIN_FLAG_N",
            "flag_outliers",
            "outlier_count",
            "outlier_threshold",
        ),
        "hpcvm.stats.overhead": ("Overhead", "OverheadMethod", "overhead"),
        "hpcvm.stats.robust": ("robust_overhead",),
        "hpcvm.stats.simulate": (
            "Coverage",
            "Population",
            "bootstrap_coverage",
            "fieller_coverage",
            "robust_coverage",
            "true_median_ratio",
        ),
        "hpcvm.stats.stopping": (
            "Replay",
            "StopDecision",
            "fixed_width_stop",
            "relative_half_width",
            "replay_auto",
        ),
        "hpcvm.stats.summary": ("DEFAULT_CONFIDENCE", "Summary", "summarize", "t_quantile"),
        "hpcvm.stats.timekeeping": ("DRIFT_LIMIT", "Drift", "clock_drift"),
        "hpcvm.stats.trust": ("Trust", "TrustIssue", "TrustKind", "overhead_trust", "sample_trust"),
    },
)
