"""Options and helpers shared by several commands."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from hpcvm.errors import UsageError

if TYPE_CHECKING:
    from rich.console import Console

F = TypeVar("F", bound=Callable[..., Any])


class _LazyConsole:
    """A rich Console made on first use. Why: every command module imports this one,
    and importing ``rich.console`` took 0.03-0.07 s of a command's ``--help`` (0.2 s
    here), which prints nothing through it."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


console = cast("Console", _LazyConsole(emoji=False))  # ":cd:" in a MAC address is no emoji
err_console = cast("Console", _LazyConsole(stderr=True, soft_wrap=True, emoji=False))


def seconds(ctx: click.Context, param: click.Parameter, value: object) -> float | None:
    """Option callback for a timeout in seconds: a finite number above zero. Click's
    float would take -1, 0, nan and inf, and a VM would then start with a deadline
    already past (or none); refused here, before anything starts, in one line naming
    the option. Give the option ``type=str`` where its default is a number (so that
    text reaches this as typed, not through click's float)."""
    if value is None:
        return None
    option = param.opts[0] if param.opts else "timeout"
    try:
        number = float(str(value))
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise UsageError(
            f"{option} {value!r} is not a positive number of seconds: give e.g. {option} 90"
        )
    return number


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h)?\s*$")


def parse_duration(text: str, what: str) -> float | None:
    """``90s``, ``30m``, ``2h``, ``1800`` (seconds) -> seconds; ``none`` -> no cap."""
    if text.strip().lower() in ("none", "off"):
        return None
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f"malformed {what} {text!r}: use e.g. 90s, 30m or 2h")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]


def host_source_options(func: F) -> F:
    """--sysfs-root / --topology: read a snapshot or an hwloc XML instead of this host."""
    func = click.option(
        "--topology",
        "topology",
        type=click.Path(path_type=Path),
        default=None,
        help="Read the host from an hwloc XML export (lstopo --of xml) instead of this machine.",
    )(func)
    func = click.option(
        "--sysfs-root",
        "sysfs_root",
        type=click.Path(path_type=Path),
        default=None,
        help="Read the host from a sysfs/proc snapshot (hwloc-gather-topology layout).",
    )(func)
    return func


def warn(message: str) -> None:
    """A warning on stderr, in one line, so it never mixes with machine output."""
    err_console.print(f"[yellow]hpcvm: warning:[/yellow] {message}", highlight=False)


def say(text: str) -> None:
    """One line of a command's progress on stderr, as typed (no rich markup: node names
    and paths are data), so stdout stays the command's own output."""
    err_console.print(text, highlight=False, markup=False)
