"""Detour distribution of noise runs, thinned for drawing (pure).

A detour is a quantum's duration minus the fastest quantum of the same CPU in the same
run (the definition of hpcvm.stats.noise_summary). The report draws the survival
function "fraction of quanta delayed by more than x" on log axes: the tail, where OS and
hypervisor noise lives, stays visible, and runs with different numbers of quanta compare
directly. Drawing every quantum (tens of thousands per CPU) would bloat the report, so
the curve is sampled at a few hundred log-spaced points.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from hpcvm.errors import BenchmarkError
from hpcvm.report.model import NoiseCurve

CURVE_POINTS = 200
SMALLEST_US = 0.01  # 10 ns: below the cost of reading the clock, nothing to see


def detours_ns(run: Mapping[int, Sequence[int]]) -> np.ndarray:
    """Every quantum's detour (ns) of one run, over all its CPUs."""
    parts = []
    for cpu, durations in run.items():
        d = np.asarray(durations, dtype=np.int64)
        if d.size == 0 or int(d.min()) <= 0:
            raise BenchmarkError(f"noise: CPU {cpu} has no positive quantum durations")
        parts.append(d - d.min())
    if not parts:
        raise BenchmarkError("noise: a run without any CPU's durations")
    return np.concatenate(parts)


def detour_curve(env: str, runs: Iterable[Mapping[int, Sequence[int]]]) -> NoiseCurve:
    """The survival function of detours pooled over ``runs`` (each: CPU -> durations)."""
    pooled = [detours_ns(run) for run in runs]
    if not pooled:
        raise BenchmarkError(f"noise: no runs of {env} to draw")
    all_us = np.sort(np.concatenate(pooled)) / 1e3
    total = int(all_us.size)
    top = float(all_us[-1])
    if top <= SMALLEST_US:
        xs = np.array([SMALLEST_US])
    else:
        xs = np.geomspace(SMALLEST_US, top, CURVE_POINTS)
    above = (total - np.searchsorted(all_us, xs, side="right")) / total
    keep = above > 0  # log y: the point past the largest detour is 0, drawn as the end
    return NoiseCurve(
        env=env,
        samples=len(pooled),
        quanta=total,
        detour_us=tuple(float(x) for x in xs[keep]),
        fraction_above=tuple(float(f) for f in above[keep]),
    )
