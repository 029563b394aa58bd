"""Answers checked against native's: how an application suite's reference answer is
made, and how each sample carries it.

An application suite (openfoam, lammps) counts a sample only if the application's
answer matches native's within the application's tolerance. The reference is computed
once per run and process count, natively on this host, when the suite prepares its
inputs (``PreparesInputs``, step 2 of bench/core/suite.py), before any environment starts.
Not the run's first native sample, because:

- environments run in a random order per block, so a VM's first sample may come before
  any native one, and its check cannot wait;
- a run may have no native environment (``--env vm:hpc`` alone) and still be checked;
- a reference run is the very program, prepared input and process count (so the same
  decomposition) of every sample: a wrong sample cannot become the reference.

The reference run is outside the measurement and never timed. Under ``bench --nodes``
it starts on the batch node with every rank there (``bind none``, oversubscribed if
needed: only its answer counts), since the decomposition, not the placement, decides
the answer.

``prepare`` writes :data:`RUN_FILE` into each sample's work directory (np, the prepared
input, the reference); ``parse`` reads it back, so a sample is judged from its own
directory, and the directory keeps what it was judged against.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcvm.bench.core.launch import CLEAN_ENV, across, decode_output, mpirun_argv
from hpcvm.bench.core.metrics import ParseError, tail
from hpcvm.errors import BenchmarkError

RUN_FILE = "hpcvm-run.json"
PREPARE_TIMEOUT = 3600.0  # a medium reference run natively, with a shared machine's slack


def run_step(argv: Sequence[str], *, log: Path, what: str, timeout: float = PREPARE_TIMEOUT) -> str:
    """Run one preparation step natively, with the clean environment every sample gets,
    its output kept in ``log``; its stdout, or a BenchmarkError naming the step, what
    it said last and the log. The step runs in a session of its own, killed with all
    it started (mpirun's ranks) on a timeout or an interruption, so none outlives it."""
    proc = subprocess.Popen(
        [*CLEAN_ENV, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise BenchmarkError(f"{what} did not finish within {timeout:g} s") from None
    except BaseException:
        _kill_group(proc)
        raise
    out, err = decode_output(stdout), decode_output(stderr)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"argv: {' '.join(argv)}\n--- stdout ---\n{out}\n--- stderr ---\n{err}\n")
    if proc.returncode != 0:
        detail = tail(err, 3) or tail(out, 3) or "no output"
        raise BenchmarkError(f"{what} exited with code {proc.returncode}: {detail} (log: {log})")
    return out


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def reference_mpirun(np: int, argv: Sequence[str]) -> list[str]:
    """``argv`` as ``np`` ranks on this node only, unbound, oversubscribed if need be."""
    with across(None):
        return mpirun_argv(np, argv, bind="none", oversubscribe=True)


def write_run_file(workdir: Path, record: dict[str, Any]) -> None:
    """What ``parse`` needs to judge this sample, next to its inputs."""
    (workdir / RUN_FILE).write_text(json.dumps(record, indent=1) + "\n")


def read_run_file(workdir: Path, suite: str) -> dict[str, Any]:
    """The record ``prepare`` wrote; ParseError when there is none (a sample whose
    answer cannot be checked does not count)."""
    try:
        data = json.loads((workdir / RUN_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ParseError(
            f"{suite}: no readable {RUN_FILE} in {workdir} ({exc}): the native reference "
            "this sample must match is unknown"
        ) from None
    if not isinstance(data, dict):
        raise ParseError(f"{suite}: {workdir / RUN_FILE} is not a JSON object")
    return data


def relative_difference(value: float, reference: float) -> float:
    """|value - reference| / |reference| (0 when both are 0, inf when only one is)."""
    if value == reference:
        return 0.0
    if reference == 0.0:
        return float("inf")
    return abs(value - reference) / abs(reference)
