"""The tuning's own error: the host refused a change or a restore."""

from __future__ import annotations

from hpcvm.errors import HpcvmError


class TuneError(HpcvmError):
    """Writing or restoring a host setting failed; the message says which file, what the
    kernel answered and what state the host was left in."""

    exit_code = 10  # 9 is SamplesFailed (bench); the lead may move this class to errors.py
