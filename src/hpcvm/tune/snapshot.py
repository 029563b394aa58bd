"""The host's tuning as it is now, for ``bench`` to record with every run.

Read only and cheap (a few dozen small /proc and /sys reads): no root needed, nothing
written, no lock taken.
"""

from __future__ import annotations

from pathlib import Path

from hpcvm.tune import state
from hpcvm.tune.errors import TuneError


def snapshot_state(state_directory: Path | None = None) -> dict[str, str]:
    """Setting name -> its current value on this host, in registry order (boot
    parameters as on /proc/cmdline, 'not set' when absent; settings the host lacks as
    'absent (why)'), plus ``hpcvm_tune``: whether hpcvm's tuning is applied now, and for
    what."""
    from hpcvm.tune.registry import REGISTRY

    values = {name: setting.current() for name, setting in REGISTRY.items()}
    try:
        saved = state.load(state.state_dir(state_directory))
    except TuneError as exc:
        values["hpcvm_tune"] = f"unknown ({exc})"
        return values
    if saved is None:
        values["hpcvm_tune"] = "not applied"
    else:
        done = "applied" if saved.complete else "partly applied (interrupted)"
        values["hpcvm_tune"] = (
            f"{done} {saved.started} for {saved.target.source}: vCPU PUs "
            f"{','.join(map(str, saved.target.vcpu_pus))}, housekeeping "
            f"{','.join(map(str, saved.target.housekeeping_pus))}"
        )
    return values
