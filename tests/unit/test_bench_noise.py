"""Noise suite: the C program's printout and raw file, read by bench/suites/noise/suite.py.

The fixture (tests/data/noise) is real output of csrc/noise.c; the per-CPU statistics
it printed are recomputed here from its raw durations, independently, with numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcvm.bench.core.metrics import ParseError
from hpcvm.bench.suites.noise.suite import (
    BINARY_ENV,
    METRICS,
    RAW_FILE,
    NoiseSuite,
    noise_binary,
    parse_report,
    per_cpu_name,
    read_raw,
    report_metrics,
)
from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.stats.noise import noise_summary

DATA = Path(__file__).resolve().parent.parent / "data" / "noise"


def stdout_fixture() -> str:
    return (DATA / "stdout.txt").read_text()


def expected_summary(durations: list[int]) -> dict[str, float]:
    """Detour statistics by their definition: detour = duration - min; p99.9 by
    nearest rank; time lost = sum(detours) / sum(durations)."""
    d = np.array(durations, dtype=np.int64)
    detours = np.sort(d - d.min())
    rank = int(np.ceil(0.999 * len(d)))
    return {
        "min_ns": float(d.min()),
        "max_detour_ns": float(detours[-1]),
        "p999_detour_ns": float(detours[rank - 1]),
        "lost_fraction": float(detours.sum() / d.sum()),
        "median_ns": float(np.sort(d)[(len(d) - 1) // 2]),
    }


def test_printout_matches_statistics_recomputed_from_raw_durations() -> None:
    report = parse_report(stdout_fixture())
    raw = read_raw(DATA / "raw.txt")
    assert sorted(raw) == [c.cpu for c in report.cpus]
    for cpu in report.cpus:
        assert len(raw[cpu.cpu]) == cpu.count == report.quanta
        want = expected_summary(raw[cpu.cpu])
        assert cpu.min_ns == want["min_ns"]
        assert cpu.median_ns == want["median_ns"]
        assert cpu.max_detour_ns == want["max_detour_ns"]
        assert cpu.p999_detour_ns == want["p999_detour_ns"]
        assert cpu.lost_fraction == pytest.approx(want["lost_fraction"], abs=1e-8)
        assert cpu.total_ns == sum(raw[cpu.cpu])


def test_printout_agrees_with_stats_noise_summary() -> None:
    """The C program and hpcvm.stats.noise_summary are two implementations of one
    definition (see bench/suites/noise/suite.py); this keeps them from drifting apart."""
    report = parse_report(stdout_fixture())
    raw = read_raw(DATA / "raw.txt")
    for cpu in report.cpus:
        summary = noise_summary(raw[cpu.cpu])
        assert summary.count == cpu.count
        assert summary.min_ns == cpu.min_ns
        assert summary.max_detour_ns == cpu.max_detour_ns
        assert summary.p999_detour_ns == cpu.p999_detour_ns
        assert summary.lost_fraction == pytest.approx(cpu.lost_fraction, abs=1e-8)


def test_metrics_summarise_all_cpus_then_each_cpu() -> None:
    report = parse_report(stdout_fixture())
    values = {v.name: v for v in report_metrics(report)}
    assert {m.name for m in METRICS} <= set(values)
    worst = max(c.max_detour_ns for c in report.cpus) / 1e3
    assert values["NoiseMaxDetour_usec"].value == pytest.approx(worst)
    assert values["NoiseQuantum_usec"].value == pytest.approx(
        min(c.min_ns for c in report.cpus) / 1e3
    )
    for cpu in report.cpus:
        detail = values[per_cpu_name(METRICS[0], cpu.cpu)]
        assert detail.value == pytest.approx(cpu.max_detour_ns / 1e3)
        assert values[f"NoiseTimeLost_pct@cpu{cpu.cpu}"].value == pytest.approx(
            100 * cpu.lost_fraction
        )
    assert all(not v.metric.higher_is_better for v in values.values())
    lost = values["NoiseTimeLost_pct"].value
    assert lost is not None and 0 <= lost <= 100


HEADER = "hpcvm-noise version=1 cpus=0 quanta=3 iterations=10 target_ns=50000 quantum_ns=50000"
CPU0 = (
    "cpu=0 count=3 min_ns=10 median_ns=11 max_detour_ns=5 p999_detour_ns=5 "
    "lost_fraction=0.1875 total_ns=36"
)


def test_minimal_printout() -> None:
    report = parse_report(f"{HEADER}\n{CPU0}\n")
    assert report.quanta == 3 and len(report.cpus) == 1
    assert report.cpus[0].lost_fraction == 0.1875


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "header"),
        (CPU0, "header"),
        (HEADER, "no per-CPU lines"),
        (f"{HEADER}\n{CPU0.replace('count=3', 'count=2')}", "ran 2 of 3"),
        (f"{HEADER}\n{CPU0.replace('min_ns=10', 'min_ns=ten')}", "min_ns"),
        (f"{HEADER}\n{CPU0.replace('lost_fraction=0.1875', 'lost=1')}", "lost_fraction"),
        (HEADER.replace("quanta=3", "quanta=x") + "\n" + CPU0, "quanta"),
    ],
)
def test_malformed_printout_is_a_failed_run(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_report(text)


def test_malformed_raw_file(tmp_path: Path) -> None:
    bad = tmp_path / "raw.txt"
    bad.write_text("cpu=0 1 2 3\ncpu=1 4 five 6\n")
    with pytest.raises(ParseError, match=":2: malformed"):
        read_raw(bad)
    with pytest.raises(ParseError, match="cannot read"):
        read_raw(tmp_path / "missing.txt")


def test_missing_binary_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(BenchmarkError, match="make all"):
        noise_binary()
    with pytest.raises(BenchmarkError):
        NoiseSuite().validate([1])


def test_prepare_argv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "hpcvm-noise"  # only located, never run, in this test
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(BINARY_ENV, str(fake))
    work = tmp_path / "work"
    argv = NoiseSuite(quanta=500, quantum_us=20, cpus=[0, 1, 2, 5]).prepare(work, 1, 0)
    assert argv[:3] == ["/usr/bin/env", "-C", str(work)]
    assert argv[3] == str(fake)
    assert argv[argv.index("-n") + 1] == "500"
    assert argv[argv.index("-q") + 1] == "20"
    assert argv[argv.index("-c") + 1] == "0-2,5"
    assert argv[argv.index("-o") + 1] == RAW_FILE
    assert work.is_dir()


@pytest.mark.parametrize("kwargs", [{"quanta": 0}, {"quantum_us": -1}, {"cpus": []}])
def test_bad_options_are_usage_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        NoiseSuite(**kwargs)  # type: ignore[arg-type]


def test_parse_nonzero_exit_is_a_failed_run(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match="cannot run on CPU 7"):
        NoiseSuite().parse(tmp_path, "", "hpcvm-noise: cannot run on CPU 7: Invalid argument", 1)


def test_suite_reads_raw_durations_from_workdir(tmp_path: Path) -> None:
    (tmp_path / RAW_FILE).write_text((DATA / "raw.txt").read_text())
    raw = NoiseSuite().raw_durations(tmp_path)
    assert set(raw) == {0, 1} and all(len(v) == 2000 for v in raw.values())
