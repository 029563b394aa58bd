"""`hpcvm bench` and `hpcvm results`: measure native against VMs, and read the results.

Thin: options become a BenchConfig (cli/bench_options.py); bench/run/session.py checks
and runs it, bench/results/results.py summarises the database, cli/bench_view.py prints
the tables.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from hpcvm.bench.envs.variants import syntax as variant_syntax
from hpcvm.bench.results.outdir import path_option
from hpcvm.bench.run.choices import (
    CONTAINER_RUNTIMES,
    DEFAULT_MAX_REPS,
    DEFAULT_VM_MEMORY,
    registered_suite_names,
    valid_env_names,
)
from hpcvm.cli.bench_options import (
    DEFAULT_ENVS,
    DEFAULT_SUITES,
    BenchOptions,
    bench_config,
    bench_options,
    stopping_overrides,
    suite_flag_options,
)
from hpcvm.cli.common import console
from hpcvm.errors import SamplesFailed, UsageError
from hpcvm.nic_models import NIC_MODELS
from hpcvm.runtime.backends.registry import BACKENDS
from hpcvm.units import format_size

if TYPE_CHECKING:  # the implementation is imported when a command runs, not for --help
    from hpcvm.bench.core.launch import Spread
    from hpcvm.bench.results.failures import CellFailures
    from hpcvm.bench.run.config import BenchConfig
    from hpcvm.cluster.benchnodes.environments import ClusterEnvironments
    from hpcvm.stats.overhead import Method
    from hpcvm.store import SampleRecord


def warn(message: str) -> None:
    """A warning on stderr in one line, never wrapped (it may be long: it names paths)."""
    click.echo(f"hpcvm: warning: {message}", err=True)


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
    from hpcvm.bench.run.writer import results_writer

    options = bench_options(kw)
    # refused before the lock is taken, a directory made or a VM booted: the path, then
    # the options (a resumed run's are read from its database, under the lock)
    check_results_dir(out, "--out")
    config = None if resume and not options.env else bench_config(options)
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
    from hpcvm.bench.run.resume import recorded_config
    from hpcvm.bench.run.session import TCG_WARNING, execute, prepare
    from hpcvm.cli.bench_view import print_report
    from hpcvm.cli.progress import ProgressBar
    from hpcvm.store import Store

    if config is None:
        config = stopping_overrides(recorded_config(out), o)
    makers, spread = _across_nodes(config, o)
    with across(spread):
        prep = prepare(config, out, resume=resume, nodes=makers)
        if prep.emulated:
            warn(TCG_WARNING)
        for text in prep.warnings:
            warn(text)
        with ProgressBar() as bar:
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
