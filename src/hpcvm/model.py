"""Shared base for hpcvm's typed results: frozen, validated, JSON round-trippable."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError


class Frozen(BaseModel):
    """Immutable pydantic model; every stage result derives from it so no stage can
    mutate another's output and every result serialises to JSON for the store."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True)
class Complaint:
    """The first thing pydantic found wrong with an input, for a one-line error: every
    input a person or another host hands over (a plan file, an option, a step's request,
    a checkpoint's record) is refused by its first complaint, not a traceback."""

    loc: tuple[str | int, ...]
    msg: str

    @property
    def where(self) -> str:
        """The field's dotted path ("" for the input as a whole)."""
        return ".".join(str(part) for part in self.loc)

    def line(self, whole: str | None = "top level") -> str:
        """ "where: what"; for the input as a whole ``whole`` names it (None: what
        alone)."""
        where = self.where or whole
        return f"{where}: {self.msg}" if where else self.msg


def first_complaint(exc: ValidationError) -> Complaint:
    """``exc``'s first complaint (Complaint)."""
    first = exc.errors()[0]
    return Complaint(tuple(first["loc"]), str(first["msg"]))
