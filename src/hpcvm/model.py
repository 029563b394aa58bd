"""Shared base for hpcvm's typed results: frozen, validated, JSON round-trippable."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Immutable pydantic model; every stage result derives from it so no stage can
    mutate another's output and every result serialises to JSON for the store."""

    model_config = ConfigDict(frozen=True, extra="forbid")
