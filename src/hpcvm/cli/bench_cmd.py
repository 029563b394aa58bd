"""`hpcvm bench` and `hpcvm results`: measure native against VMs, and read the results.

Thin: options become a BenchConfig; bench/run/session.py checks and runs it,
bench/results/results.py summarises the database, cli/bench_view.py prints the tables.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
from click.core import ParameterSource

from hpcvm.bench.core.flags import SuiteFlag
from hpcvm.bench.envs.variants import syntax as variant_syntax
from hpcvm.bench.results.outdir import path_option
from hpcvm.bench.run.choices import (
    CONTAINER_RUNTIMES,
    DEFAULT_MAX_REPS,
    DEFAULT_VM_MEMORY,
    registered_flags,
    registered_suite_names,
    valid_env_names,
)
from hpcvm.cli.common import console, err_console, parse_duration
from hpcvm.errors import SamplesFailed, UsageError
from hpcvm.nic_models import NIC_MODELS
from hpcvm.runtime.backends.registry import BACKENDS
from hpcvm.units import format_size, parse_size

if TYPE_CHECKING:  # the implementation is imported when a command runs, not for --help
    from rich.progress import TaskID

    from hpcvm.bench.core.launch import Bind, Spread
    from hpcvm.bench.results.failures import CellFailures
    from hpcvm.bench.run.config import BenchConfig
    from hpcvm.bench.suites.registry import SuiteOptions
    from hpcvm.cluster.benchnodes.environments import ClusterEnvironments
    from hpcvm.stats.overhead import Method
    from hpcvm.store import SampleRecord

# The default comparison (the README's first command): the reference study's two ends,
# QEMU's defaults and the tuned guest, against the host itself.
DEFAULT_ENVS = ("native", "vm:naive", "vm:hpc")
F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_SUITES = ("hpcc", "noise")
_SIZES = ("quick", "small", "medium")  # else a fraction of memory (bench/core/kind.py)


@dataclass(frozen=True)
class BenchOptions:
    """The bench command's options as click hands them over, typed: the parsing into a
    BenchConfig reads these fields, never an untyped dict (an unknown key is a
    TypeError)."""

    env: tuple[str, ...]
    suite: tuple[str, ...]
    np: tuple[str, ...]
    reps: str
    confidence: float
    target: str
    max_time: str
    max_reps: int
    seed: int | None
    timeout: str
    vm_vcpus: int | None
    vm_memory: str | None
    vm_guest_nodes: int | None
    vm_backend: str
    native_cpus: str | None
    size: str
    bind: Bind
    nodes: int
    batch: str
    network: str | None
    address: str | None
    container_runtime: str
    # the suite kinds' own options (bench/core/flags.py), by key, as click gave them
    suite_values: dict[str, Any] = field(default_factory=dict)


def warn(message: str) -> None:
    """A warning on stderr in one line, never wrapped (it may be long: it names paths)."""
    click.echo(f"hpcvm: warning: {message}", err=True)


def parse_target(text: str) -> float:
    """``1%`` or ``0.01`` -> 0.01."""
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"malformed --target {text!r}: use e.g. 1% or 0.01") from None


def parse_np(values: tuple[str, ...]) -> tuple[int, ...]:
    out: list[int] = []
    for text in values:
        for part in text.split(","):
            if not part.strip().isdigit() or int(part) < 1:
                raise UsageError(f"malformed --np {text!r}: use positive counts, e.g. --np 1,2")
            out.append(int(part))
    return tuple(dict.fromkeys(out)) or (1,)


def parse_reps(text: str) -> int | None:
    if text == "auto":
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"malformed --reps {text!r}: use auto or a positive number")
    return int(text)


def _check_size(text: str) -> None:
    """--size is a word every kind reads, or a fraction of memory (hpcc, npb)."""
    if text in _SIZES:
        return
    try:
        float(text)
    except ValueError:
        raise UsageError(
            f"unknown --size {text!r}: use {', '.join(_SIZES)} or a memory fraction like 0.05"
        ) from None


def _suite_options(o: BenchOptions, suites: Sequence[str]) -> SuiteOptions:
    """The chosen kinds' values (each as its kind records it) beside bind and size."""
    from hpcvm.bench.suites.registry import SuiteOptions, settled

    _check_size(o.size)
    flags = registered_flags()
    for flag in (f for kind in flags.values() for f in kind):
        value = o.suite_values.get(flag.key)
        if flag.positive and value is not None and value < 1:
            raise UsageError(
                f"{flag.flag} must be a positive number, not {value}: e.g. {flag.flag} 1000"
            )
    keys = {f.key for name in suites for f in flags.get(name, ())}
    values = {k: v for k, v in o.suite_values.items() if k in keys and v is not None}
    return SuiteOptions(bind=o.bind, size=o.size, values=settled(suites, values, Path.cwd()))


def _flag_given(flag: SuiteFlag, o: BenchOptions) -> bool:
    """Whether the user gave ``flag``: a flag that selects its suite by a value that is
    set, any other as set on the command line (its default cannot say so by its value);
    of two switches sharing a key, the one whose value it holds."""
    value = o.suite_values.get(flag.key)
    if flag.is_switch and value != flag.switch:
        return False
    return bool(value) if flag.selects else _given(flag.key)


def _suites(o: BenchOptions) -> list[str]:
    """The suites of the run: as named, else those the flags given select, else the
    default; a flag of a suite the run does not select is refused."""
    flags = [(kind, f) for kind, fs in registered_flags().items() for f in fs]
    given = list(o.suite)
    used = [(f.flag, kind) for kind, f in flags if f.selects and _flag_given(f, o)]
    if not given:
        chosen = list(dict.fromkeys(kind for _, kind in used)) or list(DEFAULT_SUITES)
    else:
        _refuse_unselected(used, given)
        chosen = given
    settings = [(f.flag, kind) for kind, f in flags if not f.selects and _flag_given(f, o)]
    _refuse_unselected(settings, chosen)
    return chosen


def _refuse_unselected(options: Iterable[tuple[str, str]], suites: Sequence[str]) -> None:
    """Refuse an option of a suite the run does not select: never silently ignored."""
    for flag, suite in options:
        if suite not in suites:
            raise UsageError(
                f"{flag} is an option of --suite {suite}, which this run does not select: "
                f"add --suite {suite} or drop {flag}"
            )


# Settings of the VMs: refused for a run with no vm:* environment.
_VM_SETTINGS = {
    "vm_vcpus": "--vm-vcpus",
    "vm_memory": "--vm-memory",
    "vm_guest_nodes": "--vm-guest-nodes",
    "vm_backend": "--vm-backend",
}


def _given(name: str) -> bool:
    """Whether the user set option ``name`` (on the command line or in the environment),
    as opposed to its default: an option with a default cannot say so by its value."""
    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _refuse_vm_settings(envs: Sequence[str]) -> None:
    """Refuse --vm-* options for a run that starts no VM: never silently ignored."""
    if any(env.startswith("vm:") for env in envs):
        return
    for key, flag in _VM_SETTINGS.items():
        if _given(key):
            raise UsageError(
                f"{flag} sets the VMs of a run, and this one has no vm:* environment: "
                f"add --env vm:hpc (or another vm:*) or drop {flag}"
            )


def _config(o: BenchOptions) -> BenchConfig:
    from hpcvm.bench.envs.kinds import canonical_env_names
    from hpcvm.bench.envs.placement import parse_native_cpus
    from hpcvm.bench.run.config import BenchConfig

    suites = _suites(o)
    memory = o.vm_memory
    envs = canonical_env_names(tuple(o.env) or DEFAULT_ENVS)
    _refuse_vm_settings(envs)
    return BenchConfig(
        envs=envs,
        suites=tuple(suites),
        np=parse_np(o.np),
        reps=parse_reps(o.reps),
        max_reps=o.max_reps,
        max_time=parse_duration(o.max_time, "--max-time"),
        target=parse_target(o.target),
        confidence=o.confidence,
        seed=o.seed,
        timeout=parse_duration(o.timeout, "--timeout") or 1e9,
        vm_vcpus=o.vm_vcpus,
        vm_memory=parse_size(memory, what="--vm-memory") if memory else DEFAULT_VM_MEMORY,
        vm_guest_nodes=o.vm_guest_nodes,
        vm_backend=o.vm_backend,
        native_cpus=parse_native_cpus(o.native_cpus),
        nodes=o.nodes,
        batch=o.batch,
        container_runtime=o.container_runtime,
        suite_options=_suite_options(o, suites),
    ).check()


def _stopping_overrides(config: BenchConfig, o: BenchOptions) -> BenchConfig:
    """With only --resume --out, the recorded run's settings; stopping flags given
    explicitly on the command line still apply."""
    source = click.get_current_context()
    update: dict[str, Any] = {}
    for flag, key, parse in (
        ("reps", "reps", parse_reps),
        ("max_reps", "max_reps", int),
        ("max_time", "max_time", lambda t: parse_duration(t, "--max-time")),
        ("target", "target", parse_target),
        ("timeout", "timeout", lambda t: parse_duration(t, "--timeout") or 1e9),
    ):
        if source.get_parameter_source(flag) == click.core.ParameterSource.COMMANDLINE:
            update[key] = parse(getattr(o, flag))
    return config.model_copy(update=update).check()


class _Bar:
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

    def __enter__(self) -> _Bar:
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


def _flag_option(flag: SuiteFlag) -> Callable[[F], F]:
    """A suite kind's flag as a click option stored under its key."""
    if flag.is_switch:
        return click.option(
            flag.flag, flag.key, flag_value=flag.switch, default=None, help=flag.help or None
        )
    return click.option(
        flag.flag,
        flag.key,
        type=flag.kind,
        default=flag.default,
        show_default=flag.show_default,
        help=flag.help or None,
    )


def suite_flag_options(command: F) -> F:
    """Every registered suite kind's flags, in the registry's order (bench/core/flags.py):
    the bench command names none of them."""
    seen: set[str] = set()
    for flags in reversed(registered_flags().values()):
        for flag in reversed(flags):
            if flag.flag not in seen:
                seen.add(flag.flag)
                command = _flag_option(flag)(command)
    return command


def _bench_options(kw: dict[str, Any]) -> BenchOptions:
    """click's values, the suite kinds' own apart (by key)."""
    keys = {f.key for flags in registered_flags().values() for f in flags}
    suite_values = {k: kw.pop(k) for k in list(kw) if k in keys}
    return BenchOptions(**kw, suite_values=suite_values)


@click.command("bench")
@click.option(
    "--env",
    multiple=True,
    help=f"Default: {' '.join(DEFAULT_ENVS)}. Environment (repeatable): "
    f"choose from {', '.join(valid_env_names())}; {variant_syntax()} "
    "(combined: vm:hpc+page=2M+thp=never; docs/comparisons.md).",
)
@click.option(
    "--suite",
    multiple=True,
    help=f"Suite (repeatable): {', '.join(registered_suite_names())}. "
    f"Default: {' '.join(DEFAULT_SUITES)}.",
)
@click.option("--np", multiple=True, help="MPI process counts, e.g. 1,2 (default 1).")
@click.option("--reps", default="auto", show_default=True, help="auto or a fixed number.")
@click.option("--confidence", type=float, default=0.97, show_default=True)
@click.option(
    "--target",
    default="1%",
    show_default=True,
    help="auto: each env x suite cell stops when its metrics' half-widths are this share "
    "of their means (extreme statistics left out).",
)
@click.option(
    "--max-time", default="30m", show_default=True, help="auto: cap on measuring time (or none)."
)
@click.option("--max-reps", type=int, default=DEFAULT_MAX_REPS, show_default=True)
@click.option("--seed", type=int, default=None, help="Seed of the interleaving (recorded).")
@click.option("--resume", is_flag=True, help="Continue the interrupted run in --out.")
@click.option("--timeout", default="1h", show_default=True, help="Per sample.")
@click.option("--vm-vcpus", type=int, default=None, help="vCPUs per VM (default: max np).")
@click.option(
    "--vm-memory", default=None, help=f"Memory per VM ({format_size(DEFAULT_VM_MEMORY)})."
)
@click.option("--vm-guest-nodes", type=int, default=None, help="numa/hpc: guest nodes.")
@click.option("--vm-backend", type=click.Choice(list(BACKENDS)), default="qemu")
@click.option(
    "--native-cpus",
    default=None,
    help="PUs native runs are confined to (a cpuset where this process may make one, "
    "else CPU affinity and memory binding), e.g. 2-5, or all. Default: the PUs and memory "
    "nodes of the most tuned VM's vCPUs.",
)
@click.option(
    "--size", default="small", show_default=True, help="quick, small, medium or a fraction."
)
@suite_flag_options
@click.option("--bind", type=click.Choice(["core", "hwthread", "none"]), default="core")
@click.option(
    "--nodes",
    type=int,
    default=1,
    show_default=True,
    help="Spread MPI ranks over this many nodes of the allocation (native: mpirun "
    "across them; each VM environment: one VM per node). See docs/cluster.md.",
)
@click.option(
    "--batch",
    default="slurm",
    show_default=True,
    help="With --nodes: the batch system that gives the nodes (slurm, or local: this "
    "machine as --nodes nodes).",
)
@click.option(
    "--network",
    default=None,
    metavar=f"KIND=SOURCE[,model={'|'.join(NIC_MODELS)}]",
    help="With --nodes: the VMs' NIC on each node (default bridge=br0).",
)
@click.option(
    "--address",
    default=None,
    metavar="IP/PREFIX",
    help="With --nodes: the first VM's address; its network carries every MPI run.",
)
@click.option(
    "--container-runtime",
    type=click.Choice(list(CONTAINER_RUNTIMES)),
    default="auto",
    show_default=True,
    help="The OCI runtime of --env container (auto: the first of crun, runc that runs "
    "the container here).",
)
@click.option("--interval", type=click.Choice(["fieller", "bootstrap"]), default="fieller")
@click.option(
    "--out",
    default="results",
    show_default=True,
    type=str,
    callback=path_option,
    metavar="DIRECTORY",
    help="Results directory.",
)
def bench_cmd(out: Path, resume: bool, interval: str, **kw: Any) -> int:
    """Run benchmarks natively and in VMs, interleaved, into OUT/hpcvm.db; print tables."""
    from hpcvm.bench.results.outdir import check_results_dir, removed_if_refused
    from hpcvm.bench.run.session import results_writer

    options = _bench_options(kw)
    # refused before the lock is taken, a directory made or a VM booted: the path, then
    # the options (a resumed run's are read from its database, under the lock)
    check_results_dir(out, "--out")
    config = None if resume and not options.env else _config(options)
    with removed_if_refused(out), results_writer(out, warn):
        return _bench(out, resume, cast("Method", interval), options, config)


def _bench(
    out: Path, resume: bool, interval: Method, o: BenchOptions, config: BenchConfig | None
) -> int:
    """The bench command while this process is the one writer of ``out``; ``config``,
    the run's settings (None: those of the run recorded in ``out``, to resume)."""
    from hpcvm.bench.core.launch import across
    from hpcvm.bench.results.export import write_exports
    from hpcvm.bench.results.failures import cell_failures
    from hpcvm.bench.results.results import summaries
    from hpcvm.bench.run.session import TCG_WARNING, execute, prepare, recorded_config
    from hpcvm.cli.bench_view import print_report
    from hpcvm.store import Store

    if config is None:
        config = _stopping_overrides(recorded_config(out), o)
    makers, spread = _across_nodes(config, o)
    with across(spread):
        prep = prepare(config, out, resume=resume, nodes=makers)
        if prep.emulated:
            warn(TCG_WARNING)
        for text in prep.warnings:
            warn(text)
        with _Bar() as bar:
            run_id, outcome = execute(prep, progress=bar, notify=bar.note)
    if outcome is None:
        warn(f"run {run_id} in {out} had already finished; showing its results")
    with Store.open(prep.out_dir) as store:
        run = store.run(run_id)
        rows = summaries(store, run_id, method=interval)
        samples = store.samples(run_id)
        failures = cell_failures(samples)
        print_report(console, run, store.environments(run_id), rows, failures)
        files = write_exports(prep.out_dir, rows, samples)
    click.echo(
        f"hpcvm: results in {store.path}; exports: {', '.join(f.name for f in files)}", err=True
    )
    _judge(failures, samples, prep.out_dir)
    return 0


def _across_nodes(
    config: BenchConfig, o: BenchOptions
) -> tuple[ClusterEnvironments | None, Spread | None]:
    """With ``--nodes N`` (N > 1): environments spanning the N nodes of this allocation
    (``--batch``) and the mpirun line that spreads ranks over them (docs/cluster.md)."""
    if config.nodes == 1:
        if o.network or o.address:
            raise UsageError("--network and --address go with --nodes N (N > 1)")
        return None, None
    from hpcvm.bench.core.launch import Spread
    from hpcvm.bench.suites.registry import REGISTRY
    from hpcvm.cluster.batch.registry import get_batch
    from hpcvm.cluster.benchnodes.environments import ClusterEnvironments, runs_network

    if o.address is None:
        raise UsageError(
            "--nodes needs --address auto (each VM an address of the site's pool) or "
            "--address IP/PREFIX (the first VM's; the next VMs take the next addresses); "
            "MPI runs use that network"
        )
    network = runs_network(o.address, o.network or "bridge=br0")
    allocation = get_batch(config.batch).allocation(config.nodes, os.environ)
    single = [s for s in config.suites if s in REGISTRY and not REGISTRY[s].spans_nodes]
    if single:
        raise UsageError(f"--suite {single[0]} measures one node's CPUs: run it without --nodes")
    makers = ClusterEnvironments(
        config=config,
        allocation=allocation,
        network=o.network or "bridge=br0",
        first_address=o.address,
        say=lambda text: click.echo(f"hpcvm: {text}", err=True),
    )
    return makers, Spread(nodes=config.nodes, network=str(network))


def _judge(failures: list[CellFailures], samples: list[SampleRecord], out: Path) -> None:
    """Say how the run ended: SamplesFailed (exit 9) when an environment x suite has no
    valid sample; "finished with failures" when some samples failed."""
    from hpcvm.bench.results.failures import failure_line, without_valid_sample
    from hpcvm.bench.run.sampling import LOGS

    empty = without_valid_sample(samples)
    if empty:
        reasons = {(f.env, f.suite): f.reason for f in failures}
        named = "; ".join(
            f"{env} {suite}: {reasons.get((env, suite), '?')}" for env, suite in empty
        )
        raise SamplesFailed(
            f"no valid sample for {named}; the failed-samples table above and the logs in "
            f"{out / LOGS} say more"
        )
    if failures:
        failed = sum(f.failed for f in failures)
        warn(
            f"finished with failures: {failed} of {len(samples)} samples failed; "
            f"most: {failure_line(max(failures, key=lambda f: f.failed))}"
        )


@click.command("results")
@click.argument("results_dir", type=str, callback=path_option)
@click.option("--json", "as_json", is_flag=True, help="Print the summaries as JSON.")
@click.option(
    "--csv",
    "csv_file",
    type=str,
    callback=path_option,
    default=None,
    metavar="FILE",
    help="Write the summaries as CSV to this file.",
)
@click.option("--run", "run_id", type=int, default=None, help="Run id (default: latest).")
@click.option("--interval", type=click.Choice(["fieller", "bootstrap"]), default="fieller")
def results_cmd(
    results_dir: Path, as_json: bool, csv_file: Path | None, run_id: int | None, interval: str
) -> int:
    """Recompute the summaries of a results directory from its database."""
    from hpcvm.bench.results.export import rows_csv, rows_json, write_atomic
    from hpcvm.bench.results.failures import cell_failures
    from hpcvm.bench.results.outdir import check_writable_file
    from hpcvm.bench.results.results import summaries
    from hpcvm.cli.bench_view import print_report
    from hpcvm.store import Store

    if csv_file is not None:
        check_writable_file(csv_file, "--csv")  # before any work, as bench --out
    with Store.open(results_dir) as store:
        run = store.run(run_id)
        rows = summaries(store, run.id, method=cast("Method", interval))
        envs = store.environments(run.id)
        failures = cell_failures(store.samples(run.id))
    if csv_file is not None:
        write_atomic(csv_file, rows_csv(rows))
    if as_json:
        sys.stdout.write(json.dumps(rows_json(rows), indent=2) + "\n")
    elif csv_file is None:
        print_report(console, run, envs, rows, failures)
    return 0


def register(group: click.Group) -> None:
    """Add this module's commands to the CLI group."""
    for command in (bench_cmd, results_cmd):
        group.add_command(command)
