"""The bench command's options, turned into a run's settings (``BenchConfig``): the
typed view of click's values, the rules every suite kind's flags follow
(bench/core/flags.py), and the VM settings refused for a run without VMs. Light for
``hpcvm bench --help``: the suite flags' click options are made here from the kinds'
light declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from hpcvm.bench.core.flags import SuiteFlag
from hpcvm.bench.run.choices import DEFAULT_VM_MEMORY, registered_flags
from hpcvm.cli.common import parse_duration
from hpcvm.errors import UsageError
from hpcvm.units import parse_size

if TYPE_CHECKING:  # the implementation is imported when a command runs, not for --help
    from hpcvm.bench.core.launch import Bind
    from hpcvm.bench.run.config import BenchConfig
    from hpcvm.bench.suites.registry import SuiteOptions

# The default comparison (the README's first command): the reference study's two ends,
# QEMU's defaults and the tuned guest, against the host itself.
DEFAULT_ENVS = ("native", "vm:naive", "vm:hpc")
F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_SUITES = ("hpcc", "noise")


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


def _suite_options(o: BenchOptions, suites: Sequence[str]) -> SuiteOptions:
    """The chosen kinds' values (each as its kind records it) beside bind and size."""
    from hpcvm.bench.core.kind import size_fraction
    from hpcvm.bench.suites.registry import SuiteOptions, settled

    size_fraction(o.size)  # a word every kind reads, or a fraction of memory: else refused
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


def bench_config(o: BenchOptions) -> BenchConfig:
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


def stopping_overrides(config: BenchConfig, o: BenchOptions) -> BenchConfig:
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


def bench_options(kw: dict[str, Any]) -> BenchOptions:
    """click's values, the suite kinds' own apart (by key)."""
    keys = {f.key for flags in registered_flags().values() for f in flags}
    suite_values = {k: kw.pop(k) for k in list(kw) if k in keys}
    return BenchOptions(**kw, suite_values=suite_values)
