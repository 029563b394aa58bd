"""The tuning's own error: the host refused a change or a restore (defined with the
others in hpcvm.errors, so every exit code is in one place)."""

from __future__ import annotations

from hpcvm.errors import TuneError

__all__ = ["TuneError"]
