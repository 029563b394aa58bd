"""Short benchmark labels and the fixed environment colours every figure shares.

Labels follow the reference studies' figures: a short benchmark name and the process
count ("HPL 2", "RA MPI 4", "MG 16"), so a bar group reads at a glance. Colours are fixed
per environment name, not by position, so ``vm:hpc`` has the same colour in every
figure of a report and in the reports of two runs put side by side.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpcvm.bench.envs.kinds import env_kind, parse_env
from hpcvm.bench.suites.registry import np_label as suite_np_label
from hpcvm.bench.suites.registry import short_name as suite_short_name
from hpcvm.errors import UsageError
from hpcvm.plan.names import PROFILE_NAMES

PROFILE_COLOURS = {
    "vm:naive": "#d62728",
    "vm:pinned": "#ff7f0e",
    "vm:hugepages": "#9467bd",
    "vm:numa": "#2ca02c",
    "vm:hpc": "#1f77b4",
}
OTHER_COLOURS = ("#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#aec7e8", "#98df8a")


def short_name(suite: str, metric: str) -> str:
    """Short benchmark name of a metric, as its suite kind defines it (bench/suites/registry.py);
    the metric's own name when none is known."""
    return suite_short_name(suite, metric) or metric


def label(suite: str, metric: str, np: int | None) -> str:
    """ "RA MPI 4", or the suite's own ("CG time, np 4"); the noise suite ignores np,
    so its labels carry none."""
    own = suite_np_label(suite, metric, np) if np is not None else None
    if own is not None:
        return own
    name = short_name(suite, metric)
    return name if np is None else f"{name} {np}"


def _rank(name: str) -> tuple[int, int, str]:
    """By kind (bench/envs/kinds.py: native, the container, the VMs, then a plugin's),
    each profile in the study's order followed by its variants (by name); names no
    registered kind reads last."""
    try:
        choice = parse_env(name)
    except UsageError:
        return (4, 0, name)
    kind = env_kind(choice.kind)
    rank = kind.rank if kind is not None else 3
    if choice.profile is None:
        return (rank, 0, name)
    return (rank, PROFILE_NAMES.index(choice.profile), "" if choice.variant.is_base else name)


def env_order(names: Iterable[str]) -> list[str]:
    """Native first, the container, then the profiles in the study's order, each
    followed by its variants, then the rest by name."""
    return sorted(dict.fromkeys(names), key=_rank)


def env_colours(names: Iterable[str]) -> dict[str, str]:
    """The colour of every environment: fixed for native, the container (their kinds'
    colours) and the five profiles; other names (variants) take the remaining colours in
    the report's order (cycling past six)."""
    colours: dict[str, str] = {}
    others = 0
    for name in env_order(names):
        kind = env_kind(name)
        if kind is not None and kind.colour is not None:
            colours[name] = kind.colour
        elif name in PROFILE_COLOURS:
            colours[name] = PROFILE_COLOURS[name]
        else:
            colours[name] = OTHER_COLOURS[others % len(OTHER_COLOURS)]
            others += 1
    return colours
