"""Statistics stage of the hpcvm pipeline (see DESIGN.md and METHOD.md): pure functions
over sequences of floats, no I/O. Results are frozen pydantic models."""

from hpcvm.stats.fieller import FiellerSet, fieller_set, welch_df
from hpcvm.stats.overhead import Overhead, overhead
from hpcvm.stats.simulate import Coverage, Population, bootstrap_coverage, fieller_coverage
from hpcvm.stats.summary import DEFAULT_CONFIDENCE, Summary, summarize, t_quantile

__all__ = [
    "DEFAULT_CONFIDENCE",
    "Coverage",
    "FiellerSet",
    "Overhead",
    "Population",
    "Summary",
    "bootstrap_coverage",
    "fieller_coverage",
    "fieller_set",
    "overhead",
    "summarize",
    "t_quantile",
    "welch_df",
]
