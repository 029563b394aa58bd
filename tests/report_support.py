"""A real results database for the report tests, measured on this machine in seconds.

Nothing here is invented: every value is a measurement taken when the fixture runs,
read with the real suites' parsers and written with the real store API. Three
environments that really differ:

- ``native``: the program as is;
- ``native-nice19``: the same under ``nice -n 19`` (on this shared, noisy machine it
  may or may not be slower; the report must show whatever was measured);
- ``tcg-user``: under ``qemu-x86_64`` user-mode emulation, i.e. QEMU's TCG engine, the
  same software emulation the VMs on this machine run under. It is not a VM (no guest
  kernel, no plan), so it is recorded with kind "vm", accel "tcg" and no plan: a real
  TCG measurement, which is what the report's TCG warning is about.

Suites: ``noise`` (hpcvm-noise, its raw per-quantum durations kept in each sample's
work directory) and ``cmd`` (``np`` concurrent ``dd`` copies; the metric is dd's own
elapsed time, read with the cmd suite's regex), 3 measured repetitions after a warm-up,
environments interleaved in random order per block. One more sample really fails (dd
from a missing file) so the report has a failed sample with its log. Interrupts per
second per source come from /proc/interrupts before and after each sample (host side),
with the bench's own evidence functions and in its evidence layout.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hpcvm.bench.core.metrics import MetricValue, ParseError
from hpcvm.bench.envs.evidence import interrupt_rates, read_interrupts, total_rate
from hpcvm.bench.suites.cmd.suite import CmdSuite
from hpcvm.bench.suites.noise.suite import RAW_FILE, noise_binary, parse_report, report_metrics
from hpcvm.stats import interleaved_order
from hpcvm.store import MetricRecord, NewEnvironment, NewSample, Store

PREFIX = {
    "native": [],
    "native-nice19": ["nice", "-n", "19"],
    "tcg-user": ["qemu-x86_64"],
}
ENVS = tuple(PREFIX)
REPS = 3
QUANTA = 2000
DD_PATTERN = r"copied, ([0-9.eE+-]+) s"
FAIL_SUITE = "cmd:missing-input"


def _dd_command(env: str, np: int) -> str:
    """np concurrent dd copies, each under the environment's prefix (inside the shell:
    qemu-x86_64 does not follow a shell's exec of a child program)."""
    one = " ".join([*PREFIX[env], "/bin/dd if=/dev/zero of=/dev/null bs=1M count=48"])
    return "sh -c '" + " & ".join([one] * np) + " & wait'"


def _run(
    argv: Sequence[str], workdir: Path
) -> tuple[subprocess.CompletedProcess[str], float, dict[str, float]]:
    workdir.mkdir(parents=True, exist_ok=True)
    before, start = read_interrupts(), time.monotonic()
    proc = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
    (workdir / "log.txt").write_text(proc.stdout + proc.stderr)
    return proc, seconds, interrupt_rates(before, read_interrupts(), seconds)


def _sample(
    env: str, suite: str, np: int | None, rep: int, position: int, workdir: Path, quantum_us: int
) -> NewSample:
    if suite == "noise":
        noise = [str(noise_binary()), "-n", str(QUANTA), "-q", str(quantum_us), "-o", RAW_FILE]
        argv = [*PREFIX[env], *noise]

        def parse(out: str, err: str, code: int) -> list[MetricValue]:
            return report_metrics(parse_report(out))

    else:
        command = _dd_command(env, np or 1) if suite == "cmd" else "dd if=/nonexistent-hpcvm"
        cmd = CmdSuite(command, DD_PATTERN, higher_is_better=False, unit="s", metric_name="dd_s")
        argv = cmd.argv

        def parse(out: str, err: str, code: int) -> list[MetricValue]:
            return cmd.parse(workdir, out, err, code)

    started = time.time()
    proc, seconds, rates = _run(argv, workdir)
    values: list[MetricValue] = []
    error = None
    try:
        values = parse(proc.stdout, proc.stderr, proc.returncode)
    except ParseError as exc:
        error = str(exc)
    return NewSample(
        env=env,
        suite=suite,
        np=np,
        repetition=rep,
        warmup=rep == 0,
        position=position,
        ok=error is None,
        error=error,
        log_path=str(workdir / "log.txt"),
        workdir=str(workdir),
        started_at=started,
        host_seconds=seconds,
        evidence={"interrupts": {"host": rates}, "interrupts_total": {"host": total_rate(rates)}},
        metrics=tuple(
            MetricRecord(
                metric=v.metric.name,
                unit=v.metric.unit,
                higher_is_better=v.metric.higher_is_better,
                value=v.value,
                error=v.error,
            )
            for v in values
        ),
    )


Cell = tuple[str, int | None]  # suite, np
CELLS: tuple[Cell, ...] = (("noise", None), ("cmd", 1), ("cmd", 2))


def measure_database(
    out: Path,
    *,
    envs: Sequence[str] = ENVS,
    cells: Sequence[Cell] = CELLS,
    quantum_us: int = 50,
    failing: bool = True,
    seed: int = 5,
) -> Path:
    """Measure ``envs`` x ``cells`` (``REPS`` blocks after a warm-up) and write
    ``out/hpcvm.db``; return ``out``. ``quantum_us`` is the noise suite's quantum: two
    databases measured with different quanta really differ in NoiseQuantum_usec."""
    with Store.open(out, create=True) as store:
        run_id = store.create_run(
            args={"env": list(envs), "cells": [list(c) for c in cells], "reps": REPS},
            seed=seed,
            confidence=0.97,
        )
        for env in envs:
            store.add_environment(
                run_id,
                NewEnvironment(
                    name=env,
                    kind="vm" if env == "tcg-user" else "native",
                    accel="tcg" if env == "tcg-user" else "native",
                    cpu_model="this machine's CPU",
                    versions={"qemu-user": "7.2"} if env == "tcg-user" else {},
                    vcpus=2,
                    memory_bytes=1 << 30,
                ),
            )
        started = time.monotonic()
        for rep in range(REPS + 1):
            for suite, np in cells:
                for position, env in enumerate(interleaved_order(envs, rep, seed)):
                    workdir = out / "work" / f"{env}-{suite}-{np}-{rep}"
                    sample = _sample(env, suite, np, rep, position, workdir, quantum_us)
                    store.add_sample(run_id, sample)
        if failing:
            failed = _sample("native", FAIL_SUITE, 1, 1, 0, out / "work" / "failing", quantum_us)
            store.add_sample(run_id, failed)
        store.add_elapsed(run_id, time.monotonic() - started)
        store.set_status(run_id, "finished", stop_reason="fixed")
    return out


_MEASURED: dict[str, Path] = {}


def measured(factory: pytest.TempPathFactory, name: str, **options: Any) -> Path:
    """A database measured once per test session (shared by every report test module)."""
    if name not in _MEASURED:
        _MEASURED[name] = measure_database(factory.mktemp(name), **options)
    return _MEASURED[name]
