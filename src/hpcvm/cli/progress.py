"""The progress of a long command on stderr: a rich bar with its ETA on a terminal, plain
lines elsewhere (a batch job's log). Imported when a run starts, never for ``--help``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from hpcvm.cli.common import err_console

if TYPE_CHECKING:
    from rich.progress import TaskID


class ProgressBar:
    """A rich progress bar with ETA on stderr; plain lines when stderr is no TTY."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.tty = err_console.is_terminal
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
        )
        self.task: TaskID | None = None

    def __enter__(self) -> ProgressBar:
        if self.tty:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tty:
            self.progress.stop()

    def note(self, message: str) -> None:
        """A line above the bar (or on its own when stderr is no TTY)."""
        if self.tty:
            self.progress.console.print(f"hpcvm: {message}", highlight=False)
        else:
            click.echo(f"hpcvm: {message}", err=True)

    def update(self, done: int, total: int, label: str) -> None:
        if not self.tty:
            click.echo(f"hpcvm: [{done + 1}/~{total}] {label}", err=True)
            return
        if self.task is None:
            self.task = self.progress.add_task(label, total=total, completed=done)
        self.progress.update(self.task, description=label, total=total, completed=done)
