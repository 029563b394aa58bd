"""`hpcvm verify NAME`: compare a running VM with its plan; exit 6 on any mismatch.

Thin: load the machine record, open the guest agent, run runtime/verify/vm.py, print a
pass/fail table (or JSON) and turn a failed report into VerificationFailed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from hpcvm.cli.common import console
from hpcvm.errors import VerificationFailed

if TYPE_CHECKING:  # imported where the command runs, so that --help imports no runtime
    from rich.table import Table

    from hpcvm.runtime.verify.checks import VerifyReport

AGENT_TIMEOUT = 30.0


def report_table(report: VerifyReport) -> Table:
    from rich.table import Table

    table = Table(title=f"verify {report.vm}", box=None, header_style="bold")
    for column in ("check", "expected", "actual", "", "detail"):
        table.add_column(column)
    for c in report.checks:
        mark = "[green]ok[/green]" if c.ok else "[red]FAIL[/red]"
        table.add_row(c.name, c.expected, c.actual, mark, c.detail)
    return table


def failure_message(report: VerifyReport) -> str:
    """One line: how many checks failed and the first of them."""
    bad = report.failures
    first = bad[0]
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return (
        f"VM {report.vm} does not match its plan: {first.name}: expected {first.expected}, "
        f"got {first.actual}{more}; `hpcvm verify {report.vm}` shows every check"
    )


@click.command("verify")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify_cmd(name: str, as_json: bool) -> int:
    """Check from inside and outside that a running VM is what its plan says."""
    from hpcvm.runtime.channels.agent import GuestAgent
    from hpcvm.runtime.machine.state import load_machine
    from hpcvm.runtime.verify.vm import verify

    machine = load_machine(name)
    if machine.boot.agent_socket is None:
        raise VerificationFailed(f"VM {name} has no guest agent socket: it cannot be verified")
    agent = GuestAgent(machine.boot.agent_socket, timeout=AGENT_TIMEOUT)
    try:
        report = verify(machine, agent)
    finally:
        agent.close()
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        console.print(report_table(report))
    if not report.ok:
        raise VerificationFailed(failure_message(report))
    return 0


def register(group: click.Group) -> None:
    """Add `verify` to the CLI group."""
    group.add_command(verify_cmd)
