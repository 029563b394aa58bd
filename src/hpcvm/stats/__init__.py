"""Statistics stage of the hpcvm pipeline (see DESIGN.md and METHOD.md): pure functions
over sequences of floats, no I/O. Results are frozen pydantic models."""

from hpcvm.stats.fieller import FiellerSet, fieller_set, welch_df
from hpcvm.stats.overhead import Overhead, overhead
from hpcvm.stats.summary import DEFAULT_CONFIDENCE, Summary, summarize, t_quantile

__all__ = [
    "DEFAULT_CONFIDENCE",
    "FiellerSet",
    "Overhead",
    "Summary",
    "fieller_set",
    "overhead",
    "summarize",
    "t_quantile",
    "welch_df",
]
