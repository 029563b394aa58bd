"""The planner's notebook: decisions and warnings collected while one plan is made.

A plan explains itself; every stage writes what it chose and why here, in words a
person can check against the host. One Notes lives for one ``plan()`` call (no globals).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcvm.plan.model import Decision, WarningKind


@dataclass
class Notes:
    decisions: list[Decision] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kinds: list[WarningKind] = field(default_factory=list)  # one per warning

    def decide(self, topic: str, text: str) -> None:
        self.decisions.append(Decision(topic=topic, text=text))

    def warn(self, text: str, kind: WarningKind = "plan") -> None:
        """A warning; ``kind`` says what it is about, so a caller can act on it (say
        the TCG warning once per run) without reading the text."""
        if text not in self.warnings:
            self.warnings.append(text)
            self.kinds.append(kind)
