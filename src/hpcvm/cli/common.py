"""Options and helpers shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

F = TypeVar("F", bound=Callable[..., Any])

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


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
