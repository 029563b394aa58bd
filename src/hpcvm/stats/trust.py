"""When the mean's interval should not be trusted for this data, and why, as data.

The Student-t interval of a mean and the Fieller/bootstrap interval of a ratio of means
promise 97% coverage only for roughly normal runs. benchmarks/stats_coverage.py shows
where the promise breaks: rare large outliers (Fieller held the true ratio in 61-90% of
experiments when 2% of VM runs were twice as slow), skewed runs (95.8% at n = 5), a
bootstrap from few runs (88-91% at n = 5). This module looks at the data for those
shapes and returns each one found as a TrustIssue whose ``kind`` a caller can act on
(count it, colour a row, pick the robust overhead) without reading the text, and whose
``text`` completes the sentence "the mean's interval should not be trusted: ...".

Checks, each with its own false-alarm rate on clean data:

- ``outliers``: flag_outliers marks a run (1% of clean samples, any n >= 5).
- ``skewed``: D'Agostino's skewness test (scipy.stats.skewtest) rejects symmetry at
  ``SKEW_LEVEL`` on the runs that are not outliers (1% of normal samples; it needs
  ``SKEW_MIN_N`` runs). Outliers are left out so the two reasons stay separate.
- ``few-runs``: fewer than MIN_FLAG_N runs, so neither check can be made (and below 2
  no interval exists at all).
- ``unbounded``: Fieller's set is unbounded (no interval; the denominator is noise).
- ``bootstrap-few-runs``: a bootstrap interval from fewer than BOOTSTRAP_MIN_N runs a side.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from scipy import stats as sps

from hpcvm.errors import UsageError
from hpcvm.model import Frozen
from hpcvm.stats._checks import Sample, finite_sample
from hpcvm.stats.outliers import MIN_FLAG_N, flag_outliers
from hpcvm.stats.overhead import BOOTSTRAP_MIN_N, Overhead

TrustKind = Literal["few-runs", "outliers", "skewed", "unbounded", "bootstrap-few-runs"]
SKEW_LEVEL = 0.01
SKEW_MIN_N = 8


class TrustIssue(Frozen):
    """One reason not to trust the mean's interval.

    ``subject`` names the sample it concerns ("native", "VM", or what the caller passed;
    empty for the overhead as a whole). ``text`` is one clause for a summary line.
    """

    kind: TrustKind
    subject: str
    text: str


class Trust(Frozen):
    """The verdict: trusted when no issue was found."""

    issues: tuple[TrustIssue, ...] = ()

    @property
    def trusted(self) -> bool:
        return not self.issues

    @property
    def kinds(self) -> tuple[TrustKind, ...]:
        return tuple(i.kind for i in self.issues)

    @property
    def sentence(self) -> str:
        """'the mean's interval should not be trusted: a; b', or '' when trusted."""
        if self.trusted:
            return ""
        return "the mean's interval should not be trusted: " + "; ".join(
            i.text for i in self.issues
        )


def _runs(n: int, subject: str) -> str:
    noun = "run" if n == 1 else "runs"
    return f"{n} {subject} {noun}" if subject else f"{n} {noun}"


def _sample_issues(values: Sample, subject: str) -> list[TrustIssue]:
    arr = finite_sample(values, f"trust verdict: {subject or 'sample'}")
    n = int(arr.size)
    if n < MIN_FLAG_N:
        why = "no interval exists" if n < 2 else "too few to check for outliers or skew"
        text = f"only {_runs(n, subject)}: {why} ({MIN_FLAG_N} needed)"
        return [TrustIssue(kind="few-runs", subject=subject, text=text)]
    issues: list[TrustIssue] = []
    flags = np.asarray(flag_outliers(arr))
    if flags.any():
        text = f"{int(flags.sum())} of {_runs(n, subject)} flagged as outliers"
        issues.append(TrustIssue(kind="outliers", subject=subject, text=text))
    bulk = arr[~flags]
    if bulk.size >= SKEW_MIN_N and float(np.ptp(bulk)) > 0.0:
        test = sps.skewtest(bulk)
        if float(test.pvalue) < SKEW_LEVEL:
            skew = float(sps.skew(bulk, bias=False))
            text = (
                f"the {_runs(int(bulk.size), subject)} are skewed (skewness {skew:.2g}, "
                f"p = {float(test.pvalue):.2g}); the interval assumes symmetric runs"
            )
            issues.append(TrustIssue(kind="skewed", subject=subject, text=text))
    return issues


def sample_trust(values: Sample, *, subject: str = "") -> Trust:
    """Verdict on the Student-t interval of one sample's mean (summarize()).

    ``subject`` names the sample in the text ("native", an environment's name).
    Raises BenchmarkError for an empty or non-finite sample.
    """
    return Trust(issues=tuple(_sample_issues(values, subject)))


def overhead_trust(native: Sample, vm: Sample, result: Overhead, *, subject: str = "VM") -> Trust:
    """Verdict on the mean's overhead interval ``result`` = overhead(native, vm, ...);
    ``subject`` names the compared environment in the text (a container is no VM).

    Raises UsageError when ``result`` is the robust overhead (it is what to use
    instead, not something this verdict judges) or does not match the samples.
    """
    if result.method == "hodges-lehmann":
        raise UsageError("overhead_trust judges the mean's overhead (fieller or bootstrap)")
    if (result.n_native, result.n_vm) != (len(native), len(vm)):
        raise UsageError(
            f"overhead_trust: the result has {result.n_native}/{result.n_vm} runs but "
            f"{len(native)}/{len(vm)} samples were given; pass the samples it came from"
        )
    issues = _sample_issues(native, "native") + _sample_issues(vm, subject)
    few = min(result.n_native, result.n_vm)
    if result.method == "fieller" and not result.bounded and few >= 2:
        text = "the Fieller interval is unbounded (the denominator's mean is not clearly non-zero)"
        issues.append(TrustIssue(kind="unbounded", subject="", text=text))
    if result.method == "bootstrap" and 2 <= few < BOOTSTRAP_MIN_N:
        text = (
            f"a bootstrap interval from {few} runs is too narrow "
            f"({BOOTSTRAP_MIN_N} per side needed)"
        )
        issues.append(TrustIssue(kind="bootstrap-few-runs", subject="", text=text))
    return Trust(issues=tuple(issues))
