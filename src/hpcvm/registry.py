"""One shape for every extension point: a named registry of things of one kind.

Render targets, report formats and benchmark suites are each a ``Registry``: adding one
is one ``register`` call (in hpcvm or from a plugin, see plugins.py); option choices and
help are built from its names; a name registered twice is a mistake, and an unknown name
is a one-line UsageError naming the known ones, never a fall-through to some default.
It reads like a dict (``names in``, ``[name]``, ``.values()``), so callers stay plain.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeVar

from hpcvm.errors import UsageError

T = TypeVar("T")


class Registry(Mapping[str, T]):
    """Things of one kind by name, in the order registered."""

    def __init__(self, what: str) -> None:
        self.what = what  # "render target": how the messages name one entry
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> None:
        if name in self._items:
            raise UsageError(f"{self.what} {name!r} is registered twice")
        self._items[name] = item

    def get_or_refuse(self, name: str) -> T:
        """The entry called ``name``; UsageError naming the known ones otherwise."""
        try:
            return self._items[name]
        except KeyError:
            raise UsageError(
                f"unknown {self.what} {name!r}: use one of {', '.join(self._items)}"
            ) from None

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
