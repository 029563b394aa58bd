"""Does the guest's clock keep time? (METHOD.md, "Evidence of cause".)

A VM's notion of time can drift from the host's (one hypervisor in the reference
studies lost 30-40 minutes a day). A benchmark that times itself inside the guest then
reports wrong figures, so every VM sample compares the host's wall time of the sample
with the time the guest measured for it.
"""

from __future__ import annotations

import math

from hpcvm.errors import BenchmarkError
from hpcvm.model import Frozen

DRIFT_LIMIT = 0.001  # 0.1%


class Drift(Frozen):
    """``relative`` = (guest - host) / host: negative when the guest clock runs slow.
    ``flagged`` when its magnitude exceeds ``limit``."""

    host_seconds: float
    guest_seconds: float
    relative: float
    flagged: bool
    limit: float = DRIFT_LIMIT


def clock_drift(host_seconds: float, guest_seconds: float, limit: float = DRIFT_LIMIT) -> Drift:
    """Compare host-measured and guest-measured durations of the same sample."""
    if not (math.isfinite(host_seconds) and host_seconds > 0.0):
        raise BenchmarkError(f"clock check: host duration must be positive, got {host_seconds}")
    if not (math.isfinite(guest_seconds) and guest_seconds >= 0.0):
        raise BenchmarkError(f"clock check: guest duration must be 0 or more, got {guest_seconds}")
    relative = (guest_seconds - host_seconds) / host_seconds
    return Drift(
        host_seconds=host_seconds,
        guest_seconds=guest_seconds,
        relative=relative,
        flagged=abs(relative) > limit,
        limit=limit,
    )
