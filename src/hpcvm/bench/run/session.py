"""One ``hpcvm bench`` run from start to end: check, start, measure, always clean up.

``prepare`` refuses everything it can before anything starts (unknown suite or
environment, a bad regex, a missing NPB directory, an impossible np, an infeasible VM
plan, an ``--out`` holding another run). ``execute`` then opens the database, boots
each VM once (left paused), runs the loop (runner.py) and, however it ends (done,
Ctrl-C, SIGTERM, an error), brings every VM down and marks the run finished,
interrupted or failed. Finished samples are already on disk by then.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpcvm.bench.core.suite import DescribesSamples, PreparesInputs, Suite
from hpcvm.bench.envs import cpuset
from hpcvm.bench.envs.environments import VM_PREFIX, Environment
from hpcvm.bench.envs.kinds import EnvRequest, make_environment, parse_env
from hpcvm.bench.envs.placement import NativePlacement, native_placement
from hpcvm.bench.envs.variant_plans import check_placed_alike
from hpcvm.bench.envs.vm import VmEnvironment, plan_vm
from hpcvm.bench.results.outdir import slug
from hpcvm.bench.results.results import outlier_marks
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.progress import ProgressSink
from hpcvm.bench.run.resume import resume_target
from hpcvm.bench.run.runner import Outcome, Runner
from hpcvm.bench.suites.registry import build_suites, calibrated, guest_dirs, validate_suites
from hpcvm.errors import HpcvmError, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.plan.memory import check_held_together, limit_charge
from hpcvm.plan.model import VMPlan
from hpcvm.signals import interrupting, signals_deferred
from hpcvm.store import (
    NewEnvironment,
    RunRecord,
    SampleRecord,
    Store,
)
from hpcvm.tune import snapshot_state

Warn = Callable[[str], None]

TCG_WARNING = (
    "TCG: the VMs run under QEMU's software emulation, not hardware virtualization; "
    "their overhead shows emulation and says nothing about KVM"
)


@dataclass
class Prepared:
    """Everything checked and built, nothing started."""

    config: BenchConfig
    out_dir: Path
    host: HostTopology
    envs: dict[str, Environment]
    suites: list[Suite]
    seed: int
    warnings: list[str] = field(default_factory=list)
    warning_envs: dict[str, str] = field(default_factory=dict)  # warning -> its environment
    resume: RunRecord | None = None
    native: NativePlacement | None = None

    @property
    def emulated(self) -> bool:
        """Whether any VM of the run runs under TCG (say TCG_WARNING once)."""
        return any(
            isinstance(e, VmEnvironment) and e.plan.accel == "tcg" for e in self.envs.values()
        )


def prepare(
    config: BenchConfig,
    out_dir: Path,
    *,
    resume: bool = False,
    host: HostTopology | None = None,
    nodes: object | None = None,
) -> Prepared:
    """Check the request against this host; build (not start) environments and suites.

    ``nodes``: None for this host's environments; the nodes of a ``bench --nodes`` run
    (cluster/benchnodes/environments.py) for ones that span them. Each environment's
    kind makes it (bench/envs/kinds.py)."""
    from hpcvm.host import discover

    config.check()
    out_dir = out_dir.absolute()
    choices = {name: parse_env(name) for name in config.envs}
    suites = build_suites(config.suites, config.suite_options)
    validate_suites(suites, config.np)
    previous = resume_target(config, out_dir, resume)
    host = host if host is not None else discover()
    warnings: list[str] = []
    warning_envs: dict[str, str] = {}
    plans: dict[str, VMPlan] = {}
    for name, (plan, notes) in vm_plans(config, host).items():
        warnings += notes
        warning_envs.update(dict.fromkeys(notes, name))
        plans[name] = plan
    check_placed_alike(plans)
    native = _confined(_native(config, previous, plans, host), previous)
    config = _calibrated(config, previous, native)
    suites = build_suites(config.suites, config.suite_options)
    envs: dict[str, Environment] = {}
    extra = _guest_shares(config, suites, out_dir)
    for name, choice in choices.items():
        request = EnvRequest(
            choice=choice,
            host=host,
            cpus=native.cpus,
            mems=native.mems,
            confine=native.confine,
            shares=extra,
            out_dir=out_dir,
            container_runtime=config.container_runtime,
            backend=config.vm_backend,
            plan=plans.get(name),
            vm_name=f"bench{os.getpid()}-{slug(name.removeprefix(VM_PREFIX))}",
        )
        envs[name] = make_environment(request, nodes)
    _check_np(config, suites, envs)
    return Prepared(
        config=config,
        out_dir=out_dir,
        host=host,
        envs=envs,
        suites=suites,
        seed=previous.seed if previous is not None else _seed(config),
        warnings=warnings,
        warning_envs=warning_envs,
        resume=previous,
        native=native,
    )


def vm_plans(config: BenchConfig, host: HostTopology) -> dict[str, tuple[VMPlan, list[str]]]:
    """Each VM environment's plan on ``host``, with its warnings (by env name)."""
    plans: dict[str, tuple[VMPlan, list[str]]] = {}
    for name in config.envs:
        choice = parse_env(name)
        if choice.profile is not None:
            plans[name] = plan_vm(
                choice.profile,
                vcpus=config.vcpus,
                memory_bytes=config.vm_memory,
                guest_nodes=config.vm_guest_nodes,
                host=host,
                variant=choice.variant,
            )
    charges = [(n, limit_charge(p.memory_bytes, p.page_size_bytes)) for n, (p, _) in plans.items()]
    check_held_together(host, charges)
    return plans


def native_on(config: BenchConfig, host: HostTopology) -> NativePlacement:
    """Where native runs on ``host`` for ``config`` (what a node of ``bench --nodes``
    computes for itself: cluster/benchnodes/native_places.py)."""
    plans = {name: plan for name, (plan, _notes) in vm_plans(config, host).items()}
    return _native(config, None, plans, host)


# What a built-in guest shares anyway (runtime/hostside/shares.py): programs there need nothing.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/opt", "/etc")
INPUTS = "inputs"  # under the results directory: the inputs suites prepare once per run


def inputs_dir(out_dir: Path, suite: Suite) -> Path:
    """Where ``suite`` prepares its inputs (bench/core/suite.py, step 2)."""
    return out_dir / INPUTS / slug(suite.name)


def _guest_shares(
    config: BenchConfig, suites: Sequence[Suite] = (), out_dir: Path | None = None
) -> tuple[str, ...]:
    """Directories the suites run from that a guest would not otherwise see: those their
    kinds name (the NPB bin directory, a --cmd program's directory), the inputs prepared
    once per run (``out_dir``/inputs), each outside the working directory and the system directories
    (shared read-only, at their host paths)."""
    dirs: list[Path] = []
    if out_dir is not None and any(isinstance(s, PreparesInputs) for s in suites):
        dirs.append(out_dir / INPUTS)
    dirs += guest_dirs(config.suites, config.suite_options)
    cwd = Path.cwd().resolve()
    out = []
    for d in dirs:
        resolved = d.resolve()
        inside = [resolved, *resolved.parents]
        if cwd in inside or any(Path(s) in inside for s in _SYSTEM_DIRS):
            continue
        out.append(str(resolved))
    return tuple(dict.fromkeys(out))


def _native(
    config: BenchConfig, previous: RunRecord | None, plans: dict[str, VMPlan], host: HostTopology
) -> NativePlacement:
    """Where native runs: as recorded for a resumed run, else the VMs' PUs and nodes."""
    if previous is not None and "native" in previous.args:
        return NativePlacement.model_validate(previous.args["native"])

    def pinned() -> VMPlan:
        return plan_vm("pinned", vcpus=config.vcpus, memory_bytes=config.vm_memory, host=host)[0]

    return native_placement(config.native_cpus, plans, host, pinned)


def _confined(native: NativePlacement, previous: RunRecord | None) -> NativePlacement:
    """How this host holds native runs to their PUs: as recorded for a resumed run, a
    cpuset where this process may make one, else CPU affinity (bench/envs/native.py)."""
    if previous is not None or native.cpus is None or cpuset.probe(native.cpus, native.mems):
        return native
    return native.model_copy(update={"confine": "affinity"})


def _calibrated(
    config: BenchConfig, previous: RunRecord | None, native: NativePlacement
) -> BenchConfig:
    """What the suites calibrate once per run (noise's quantum of work) on native's
    first PU, or as recorded for a resumed run, so every environment times the same."""
    recorded = None
    if previous is not None:
        recorded = BenchConfig.model_validate(previous.args["config"]).suite_options
    first = native.cpus[0] if native.cpus else None
    options = calibrated(config.suites, config.suite_options, recorded, first)
    return config.model_copy(update={"suite_options": options})


def _seed(config: BenchConfig) -> int:
    return config.seed if config.seed is not None else secrets.randbelow(2**31)


def _check_np(config: BenchConfig, suites: list[Suite], envs: dict[str, Environment]) -> None:
    if not any(s.uses_np for s in suites):
        return
    wanted = max(config.np)
    # VMs first: native's PU count follows theirs, so a VM's size is the thing to change
    for name, env in sorted(envs.items(), key=lambda item: item[1].kind != "vm"):
        if wanted > env.vcpus:
            where = "vCPUs (--vm-vcpus)" if env.kind == "vm" else "PUs to run on (--native-cpus)"
            raise UsageError(
                f"--np {wanted} is impossible in {name}: it has {env.vcpus} {where}; "
                f"use --np {env.vcpus} or fewer"
            )


def _prepare_inputs(prep: Prepared, notify: Warn | None) -> None:
    """Each suite's inputs made once, natively, before any environment starts (a
    resumed run makes them again: the same inputs, the same native answers)."""
    for suite in prep.suites:
        if isinstance(suite, PreparesInputs):
            directory = inputs_dir(prep.out_dir, suite)
            suite.prepare_inputs(directory, prep.config.np)
            if notify is not None:
                notify(f"{suite.name}: inputs and native reference ready in {directory}")


def _start_and_record(prep: Prepared, store: Store, run_id: int, notify: Warn | None) -> None:
    """Boot every VM (each is left paused) and record every environment."""
    for name, env in prep.envs.items():
        env.start()
        described = env.describe()
        recorded = store.add_environment(run_id, described)
        _compare(recorded.model_dump(include={"accel", "cpu_model"}), described, store, run_id)
        if notify is not None and isinstance(env, VmEnvironment):
            state = "paused" if env.pauses else "left running while others are measured"
            notify(f"{name}: up ({described.accel}, {described.vcpus} vCPUs), {state}")


def _compare_tuning(run: RunRecord, store: Store) -> None:
    """A resumed run whose host tuning changed since it started mixes two setups."""
    before = run.args.get("tuning")
    if not isinstance(before, dict):
        return
    now = snapshot_state()
    changed = sorted(k for k in now if k in before and before[k] != now[k])
    if changed:
        store.add_warning(
            run.id,
            f"the host's tuning changed since the run started ({', '.join(changed)}): its "
            "samples mix two setups",
        )


def _compare(recorded: dict[str, object], now: NewEnvironment, store: Store, run_id: int) -> None:
    for key, value in recorded.items():
        if getattr(now, key) != value:
            store.add_warning(
                run_id,
                f"{now.name}: {key} changed on resume ({value!r} before, "
                f"{getattr(now, key)!r} now): its samples mix two setups",
                env=now.name,
            )


def execute(
    prep: Prepared,
    *,
    progress: ProgressSink | None = None,
    notify: Warn | None = None,
) -> tuple[int, Outcome | None]:
    """Run (or continue) the prepared run; return its id and how the loop ended
    (``None`` when a resumed run had already finished). Always brings the VMs down.
    ``notify`` hears what happens outside the samples (a VM is up)."""
    store = Store.open(prep.out_dir, create=True)
    try:
        if prep.resume is not None:
            run_id = prep.resume.id
            if prep.resume.status == "finished":
                return run_id, None
            store.set_status(run_id, "running")
            for text in prep.warnings:
                store.add_warning(run_id, text, env=prep.warning_envs.get(text))
            _compare_tuning(prep.resume, store)
        else:
            run_id = store.create_run(
                args={
                    "config": prep.config.model_copy(update={"seed": prep.seed}).record(),
                    "native": None if prep.native is None else prep.native.model_dump(mode="json"),
                    "tuning": snapshot_state(),
                },
                seed=prep.seed,
                confidence=prep.config.confidence,
                host=prep.host.model_dump(mode="json"),
                warnings=prep.warnings,
                warning_envs=prep.warning_envs,
            )
        return run_id, _measure(prep, store, run_id, progress, notify)
    finally:
        store.close()


def _measure(
    prep: Prepared,
    store: Store,
    run_id: int,
    progress: ProgressSink | None,
    notify: Warn | None,
) -> Outcome:
    try:
        with interrupting():
            _prepare_inputs(prep, notify)
            _start_and_record(prep, store, run_id, notify)
            runner = Runner(
                store=store,
                run_id=run_id,
                seed=prep.seed,
                config=prep.config,
                envs=prep.envs,
                suites=prep.suites,
                out_dir=prep.out_dir,
                sizing_memory=min(e.memory_bytes for e in prep.envs.values()),
                progress=progress,
                notify=notify,
            )
            outcome = runner.run()
    except KeyboardInterrupt:
        with signals_deferred():
            _close_all(prep, store, run_id)
            _mark_outliers(store, run_id)
            store.set_status(run_id, "interrupted")
        raise
    except BaseException as exc:
        with signals_deferred():
            _close_all(prep, store, run_id)
            message = exc.message if isinstance(exc, HpcvmError) else f"{type(exc).__name__}: {exc}"
            store.set_status(run_id, "failed", error=message)
        raise
    with signals_deferred():
        _close_all(prep, store, run_id)
        samples = store.samples(run_id)
        measured = [s for s in samples if not s.warmup]
        for text in _resolution_warnings(prep.suites, measured):
            store.add_warning(run_id, text)
        _mark_outliers(store, run_id, samples)
        store.set_status(
            run_id, "finished", stop_reason=outcome.stop_reason, stop_detail=outcome.detail
        )
    return outcome


def _mark_outliers(store: Store, run_id: int, samples: list[SampleRecord] | None = None) -> None:
    """Mark the run's outlying values in the database (they are kept and summarised;
    the table counts them and the robust overhead is shown beside the mean's)."""
    taken = store.samples(run_id) if samples is None else samples
    store.set_outliers(run_id, outlier_marks(taken))


def _resolution_warnings(suites: list[Suite], samples: list[SampleRecord]) -> list[str]:
    """Once per suite, metric and np: a program that prints a metric in steps coarser
    than about 1% of its mean (NPB's 0.01 s on a short class) says so, with what to do."""
    out: list[str] = []
    for suite in suites:
        if not isinstance(suite, DescribesSamples):
            continue
        values: dict[tuple[str, int], list[float]] = {}
        for s in samples:
            if s.suite == suite.name and s.ok:
                for m in s.metrics:
                    if m.value is not None:
                        values.setdefault((m.metric, s.np or 1), []).append(m.value)
        for (metric, np_), vals in values.items():
            text = suite.resolution_warning(metric, np_, vals)
            if text and text not in out:
                out.append(text)
    return out


def _close_all(prep: Prepared, store: Store, run_id: int) -> None:
    """Every environment closed, whatever state it is in: a failure to close one (a VM
    that will not stop, a cpuset the kernel keeps busy, any error at all) is recorded
    and the others are still closed, so no QEMU outlives the run."""
    for name, env in prep.envs.items():
        try:
            env.close()
        except Exception as exc:  # the next environment must still close
            text = exc.message if isinstance(exc, HpcvmError) else f"{type(exc).__name__}: {exc}"
            store.add_warning(run_id, f"{name}: closing it failed: {text}", env=name)
