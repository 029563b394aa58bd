"""The contract of a tuning setting, and the common case: one file, one value.

A setting answers four questions, each from the live kernel's files: does this host
have it (``lacking``), what does the target want and what is there (``check``), and
which writes would make it so (``changes``). It never writes itself: the engine does,
after saving what it overwrites, so every setting is restored the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from hpcvm.tune import files
from hpcvm.tune.model import Change, Row, TuneTarget, When


class Setting(ABC):
    """One registry entry. Subclasses set the class attributes and the methods."""

    name: ClassVar[str]
    what: ClassVar[str]  # one line: what it does and why the plan wants it
    when: ClassVar[When] = "runtime"

    @abstractmethod
    def lacking(self) -> str | None:
        """None when this host has the setting, else why not (reported, not invented)."""

    @abstractmethod
    def check(self, target: TuneTarget) -> Row:
        """What the target wants against what the host has now."""

    @abstractmethod
    def changes(self, target: TuneTarget) -> list[Change]:
        """The writes that make the host match ``target`` (none when it already does)."""

    def current(self) -> str:
        """What the host has now, short, for ``snapshot_state`` (no target needed)."""
        return self.lacked_row_text() if self.lacking() else self._current()

    def _current(self) -> str:
        return "-"

    def lacked_row_text(self) -> str:
        return f"absent ({self.lacking()})"

    def row(self, wanted: str, has: str, ok: bool | None, note: str = "") -> Row:
        return Row(
            name=self.name, when=self.when, what=self.what, wanted=wanted, has=has, ok=ok, note=note
        )

    def lacked(self, wanted: str) -> Row:
        return self.row(wanted, "absent", None, self.lacking() or "")


class FileSetting(Setting):
    """A setting that is one file holding one value (most sysctls and sysfs knobs)."""

    path: ClassVar[str]
    lacking_reason: ClassVar[str] = "the kernel does not have it"

    def lacking(self) -> str | None:
        return None if Path(self.path).exists() else f"no {self.path}: {self.lacking_reason}"

    @abstractmethod
    def wanted(self, target: TuneTarget) -> str:
        """The value apply writes."""

    def is_ok(self, value: str, target: TuneTarget) -> bool:
        """Whether the file's value (``value_of``) already serves the target."""
        return value == self.wanted(target)

    def value_of(self, raw: str) -> str:
        """The value in the file's text (the text stripped, unless the file says more)."""
        return raw.strip()

    def shown(self, raw: str) -> str:
        """The file's value as people read it."""
        return self.value_of(raw)

    def restore_value(self, raw: str) -> str:
        """What to write to get ``raw`` back."""
        return self.value_of(raw)

    def _read(self) -> str:
        raw = files.read(self.path)
        return "" if raw is None else raw

    def _current(self) -> str:
        return self.shown(self._read())

    def check(self, target: TuneTarget) -> Row:
        """Both columns as people read them: ``shown`` decodes what is wanted as it
        decodes what the host has (a hex mask with its PU list)."""
        wanted = self.shown(self.wanted(target))
        if self.lacking():
            return self.lacked(wanted)
        raw = self._read()
        return self.row(wanted, self.shown(raw), self.is_ok(self.value_of(raw), target))

    def changes(self, target: TuneTarget) -> list[Change]:
        if self.lacking():
            return []
        raw = self._read()
        if self.is_ok(self.value_of(raw), target):
            return []
        return [
            Change(
                setting=self.name,
                path=self.path,
                before=raw,
                value=self.wanted(target),
                restore=self.restore_value(raw),
            )
        ]
