"""What a command run in the guest returned, apart from the runtime's pydantic models so
that the agent's client (runtime/channels/agent.py) and ``hpcvm exec`` import none of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    """What a command run in the guest returned."""

    exit_code: int
    stdout: str
    stderr: str
    signal: int | None = None
    seconds: float = 0.0
