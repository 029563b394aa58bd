"""Which environment runs: before an environment's turn the loop (runner.py) pauses every
other one, then resumes it, so that two never run at once (another guest's work would
land in its samples as noise).

Kept apart because it is the one place the loop acts on the environments themselves
rather than on samples, and a failure here is not the run's: a VM that cannot be paused
or resumed (it died) is a warning, its samples then fail one by one with the reason, and
the run goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hpcvm.bench.envs.environments import Environment
from hpcvm.errors import HpcvmError


class Switch:
    """Keeps one environment of ``envs`` running; ``warn(text, env)`` keeps a warning."""

    def __init__(self, envs: Mapping[str, Environment], warn: Callable[[str, str], None]) -> None:
        self.envs = envs
        self.warn = warn
        self.active: str | None = None

    def to(self, name: str) -> None:
        """Pause every other environment, then resume this one (never two running)."""
        if self.active == name:
            return
        for other, env in self.envs.items():
            if other != name:
                self._guarded(other, env.deactivate, "pause")
        self._guarded(name, self.envs[name].activate, "resume")
        self.active = name

    def _guarded(self, name: str, action: Callable[[], None], what: str) -> None:
        """A VM that cannot be paused or resumed (it died) is a warning; its samples
        then fail one by one with the reason, and the run goes on."""
        try:
            action()
        except HpcvmError as exc:
            self.warn(f"{name}: {what} failed: {exc}", name)
