"""`hpcvm tune`: check, apply or revert the host tuning a VM's plan recommends.

Thin: pick the action and the target from the flags, call hpcvm.tune.engine, print a
table (or JSON). Everything that writes lives in hpcvm.tune.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcvm.cli.common import console, warn
from hpcvm.errors import UsageError
from hpcvm.tune.dirs import DEFAULT_DIR, ENV_DIR

if TYPE_CHECKING:  # imported where the command runs, so that --help imports no tuning
    from rich.table import Table

    from hpcvm.tune.model import Change, Row, TuneTarget


def say(text: str) -> None:
    """One line of plain output: no rich markup (values like THP's '[madvise]' are
    data) and no re-wrapping, so it can be read by scripts too."""
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def resolve_target(
    vm: str | None, plan: Path | None, vcpu_pus: str | None, housekeeping_pus: str | None
) -> TuneTarget | None:
    """The target the flags name, None when they name none; one-line error when they
    name two or only half of one."""
    from hpcvm.tune import target as targets

    given = [
        flag for flag, value in (("--for", vm), ("--plan", plan), ("--vcpu-pus", vcpu_pus)) if value
    ]
    if len(given) > 1:
        raise UsageError(f"give one of --for, --plan, --vcpu-pus, not {' and '.join(given)}")
    if housekeeping_pus is not None and vcpu_pus is None:
        raise UsageError("--housekeeping-pus goes with --vcpu-pus")
    if vm:
        return targets.from_vm(vm)
    if plan:
        return targets.from_plan_file(plan)
    if vcpu_pus:
        return targets.from_lists(vcpu_pus, housekeeping_pus)
    return None


def rows_table(rows: list[Row]) -> Table:
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    table.add_column("setting", no_wrap=True)
    table.add_column("changes", no_wrap=True)
    table.add_column("wanted")
    table.add_column("host has")
    table.add_column("", no_wrap=True)
    for r in rows:
        mark = {True: "[green]ok[/green]", False: "[red]NO[/red]", None: "[dim]absent[/dim]"}[r.ok]
        when = "runtime" if r.when == "runtime" else "reboot"
        table.add_row(r.name, when, escape(r.wanted), escape(r.has), mark)
    return table


def _boot_tokens(t: TuneTarget) -> dict[str, str]:
    from hpcvm.tune.registry import REGISTRY
    from hpcvm.tune.settings.boot import BootParam

    return {s.name: s.token(t) for s in REGISTRY.values() if isinstance(s, BootParam)}


def print_check(t: TuneTarget, directory: Path) -> None:
    from hpcvm.plan.tuning import BOOT_CPU
    from hpcvm.tune import engine
    from hpcvm.tune.settings.boot import boot_advice

    rows = engine.check(t)
    title = (
        f"tuning for {t.source}: vCPU PUs {','.join(map(str, t.vcpu_pus))}, "
        f"housekeeping PUs {','.join(map(str, t.housekeeping_pus))}"
    )
    say(title)
    if set(t.vcpu_pus) - set(t.isolated_pus()):
        say(
            f"  CPU {BOOT_CPU} runs a vCPU but is never isolated at boot: it is the kernel's "
            "boot CPU (timekeeping, interrupts that cannot move); run-time settings still "
            "move what can move off it"
        )
    console.print(rows_table(rows))
    for r in rows:
        if r.note and r.ok is not True:
            say(f"  {r.name}: {r.note}")
    for line in boot_advice(rows, _boot_tokens(t)):
        say(line)
    saved = engine.saved_state(directory)
    if saved is not None:
        say(
            f"applied by hpcvm {saved.started} for {saved.target.source}"
            f"{'' if saved.complete else ' (interrupted midway)'}: "
            f"`hpcvm tune --revert` restores the {len(saved.changes)} saved values"
        )


def _show_change(c: Change, verb: str) -> str:
    return f"{verb} {c.path}: {c.before.strip()!r} -> {c.value!r}"


def do_apply(t: TuneTarget, directory: Path, dry_run: bool) -> None:
    from hpcvm.tune import engine, state

    result = engine.apply(t, directory, dry_run=dry_run)
    verb = "would write" if dry_run else "wrote"
    for c in result.changes:
        say(_show_change(c, verb))
    for path in result.refused:
        warn(
            f"the kernel keeps {path} where it is (it refused the move: a kernel-managed "
            "or platform-pinned interrupt)"
        )
    if not result.changes:
        say("nothing to change: every run-time setting already matches")
    elif not dry_run:
        say(
            f"saved the old values in {directory / state.STATE_FILE}; "
            "`hpcvm tune --revert` restores them"
        )
    if not dry_run:
        print_check(t, directory)


def do_revert(directory: Path) -> None:
    from hpcvm.tune import engine

    result = engine.revert(directory)
    if result.state is None:
        say(f"nothing to revert: no saved tuning in {directory}")
        return
    for c in result.restored:
        say(f"restored {c.path}: {c.restore!r}")
    for path in result.gone:
        warn(f"{path} no longer exists (its IRQ or CPU went away): nothing to restore")
    say(f"reverted the tuning applied {result.state.started} for {result.state.target.source}")


def write_tuned_profile(t: TuneTarget, directory: Path) -> None:
    from hpcvm.tune.tuned import tuned_profile

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tuned.conf"
    path.write_text(tuned_profile(t))
    say(
        f"wrote {path}; on a host running tuned: cp -r {directory} /etc/tuned/ && "
        f"tuned-adm profile {directory.name} (revert: tuned-adm profile <previous>)"
    )


def _action(*, check: bool, apply: bool, revert: bool) -> str:
    """The one action asked for (check when none is): two would leave the choice to the
    order the flags were typed in, and --apply --revert must not silently do either."""
    given = [name for name, on in (("check", check), ("apply", apply), ("revert", revert)) if on]
    if len(given) > 1:
        raise UsageError(
            f"{' and '.join('--' + g for g in given)} exclude each other: give one of "
            "--check, --apply, --revert"
        )
    return given[0] if given else "check"


@click.command("tune")
@click.option("--check", is_flag=True, help="Compare (default).")
@click.option("--apply", is_flag=True, help="Apply the run-time settings.")
@click.option("--revert", is_flag=True, help="Restore what --apply saved.")
@click.option("--dry-run", is_flag=True, help="With --apply: print the writes, do none.")
@click.option("--for", "vm", default=None, help="Tune for this running VM's plan.")
@click.option("--plan", type=click.Path(path_type=Path), default=None, help="A plan JSON file.")
@click.option("--vcpu-pus", default=None, help="PUs to keep quiet, e.g. 2-7.")
@click.option("--housekeeping-pus", default=None, help="PUs for IRQs etc. (default: the rest).")
@click.option(
    "--tuned-profile",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a tuned profile (DIR/tuned.conf) for the target instead.",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help=f"Where the saved values live (${ENV_DIR}, default {DEFAULT_DIR}).",
)
@click.option("--json", "as_json", is_flag=True, help="--check: print the rows as JSON.")
def tune_cmd(
    check: bool,
    apply: bool,
    revert: bool,
    dry_run: bool,
    vm: str | None,
    plan: Path | None,
    vcpu_pus: str | None,
    housekeeping_pus: str | None,
    tuned_profile: Path | None,
    state_dir: Path | None,
    as_json: bool,
) -> int:
    """Check, apply or revert the host tuning that keeps a VM's PUs quiet: IRQs,
    workqueues, watchdog, timers, vmstat, NUMA balancing, KSM, THP, cpufreq, idle
    latency at run time; isolcpus/nohz_full/rcu_nocbs/irqaffinity at boot."""
    from hpcvm.tune import engine, state

    directory = state.state_dir(state_dir)
    action = _action(check=check, apply=apply, revert=revert)
    if dry_run and action != "apply":
        raise UsageError("--dry-run goes with --apply")
    if as_json and action != "check":
        raise UsageError("--json goes with --check")
    if tuned_profile is not None and action == "apply":
        raise UsageError(
            "--tuned-profile writes a profile for tuned instead of applying: drop --apply"
        )
    t = resolve_target(vm, plan, vcpu_pus, housekeeping_pus)
    if action == "revert":
        if t is not None or tuned_profile is not None:
            raise UsageError("--revert takes no target: it restores exactly what --apply saved")
        do_revert(directory)
        return 0
    if t is None and action == "check":
        saved = engine.saved_state(directory)
        t = saved.target if saved else None
    if t is None:
        raise UsageError(
            "say what to tune for: --for VM, --plan plan.json or --vcpu-pus LIST "
            "[--housekeeping-pus LIST]"
        )
    if tuned_profile is not None:
        write_tuned_profile(t, tuned_profile)
    elif action == "apply":
        do_apply(t, directory, dry_run)
    elif as_json:
        click.echo(json.dumps([r.model_dump() for r in engine.check(t)], indent=2))
    else:
        print_check(t, directory)
    return 0


def register(group: click.Group) -> None:
    """Add `tune` to the CLI group."""
    group.add_command(tune_cmd)
