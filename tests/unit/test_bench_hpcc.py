"""hpcc input writer and summary parser, on real hpcc output (tests/data/hpcc, measured
here; see its README) and on synthetic edge cases of the %g summary format."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcvm.bench.core.metrics import MetricValue, ParseError
from hpcvm.bench.suites.hpcc.suite import (
    COMMUNICATION_METRICS,
    INPUT_FILE,
    MAX_MEMORY_FRACTION,
    METRICS,
    OUTPUT_FILE,
    HpccInput,
    HpccSuite,
    parse_output,
    plan_input,
    problem_size,
    process_grid,
    read_summary,
    warmup_input,
)
from hpcvm.errors import BenchmarkError, UsageError
from hpcvm.units import GIB, MIB

DATA = Path(__file__).resolve().parent.parent / "data" / "hpcc"
EXAMPLE_INPUT = Path("/usr/share/doc/hpcc/examples/_hpccinf.txt")


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def by_name(values: list[MetricValue]) -> dict[str, MetricValue]:
    return {v.name: v for v in values}


# --- process grid and sizes -----------------------------------------------------------


def squarest_by_brute_force(np: int) -> tuple[int, int]:
    pairs = [(p, np // p) for p in range(1, np + 1) if np % p == 0 and p <= np // p]
    return min(pairs, key=lambda pq: pq[1] - pq[0])


@pytest.mark.parametrize("np", range(1, 17))
def test_process_grid_is_the_squarest_factorisation(np: int) -> None:
    p, q = process_grid(np)
    assert p * q == np
    assert p <= q
    assert (p, q) == squarest_by_brute_force(np)


def test_process_grid_known_shapes() -> None:
    assert process_grid(1) == (1, 1)
    assert process_grid(2) == (1, 2)
    assert process_grid(7) == (1, 7)
    assert process_grid(12) == (3, 4)
    assert process_grid(16) == (4, 4)


def test_process_grid_rejects_zero() -> None:
    with pytest.raises(UsageError):
        process_grid(0)


@pytest.mark.parametrize("budget", [1 * MIB, 8 * MIB, 100 * MIB, 3 * GIB, 10 * GIB + 12345])
@pytest.mark.parametrize("nb", [80, 192])
def test_problem_size_is_the_largest_fitting_multiple_of_2nb(budget: int, nb: int) -> None:
    n = problem_size(budget, nb)
    assert n % (2 * nb) == 0
    assert 8 * n * n <= budget
    assert 8 * (n + 2 * nb) ** 2 > budget


def test_small_size_is_quick_and_grows_with_np() -> None:
    one = plan_input(1, 24 * GIB, "small")
    two = plan_input(2, 24 * GIB, "small")
    assert 900 <= one.n <= 2000
    assert 1000 <= two.n <= 2000
    assert two.n > one.n  # same matrix memory per process
    assert (one.p, one.q) == (1, 1) and (two.p, two.q) == (1, 2)


@pytest.mark.parametrize("fraction", [0.05, 0.25, 0.5, MAX_MEMORY_FRACTION])
def test_fraction_size_fits_the_memory_fraction(fraction: float) -> None:
    memory = 4 * GIB
    spec = plan_input(4, memory, fraction)
    assert spec.matrix_bytes <= fraction * memory
    # ... and is not needlessly small: one more 2*NB step would not fit.
    assert 8 * (spec.n + 2 * spec.nb) ** 2 > fraction * memory
    assert 80 <= spec.nb <= 192


def test_small_size_never_exceeds_the_memory_cap() -> None:
    memory = 20 * MIB  # less than 8 MiB per process for 4 processes
    spec = plan_input(4, memory, "small")
    assert spec.matrix_bytes <= MAX_MEMORY_FRACTION * memory


@pytest.mark.parametrize("bad", [0.0, -0.1, 0.95, 2.0])
def test_bad_fraction_is_a_usage_error(bad: float) -> None:
    with pytest.raises(UsageError, match="fraction"):
        plan_input(1, GIB, bad)


def test_unknown_preset_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown hpcc size 'huge'"):
        HpccSuite("huge")  # type: ignore[arg-type]


def test_too_little_memory_is_refused() -> None:
    with pytest.raises(BenchmarkError, match="too small"):
        plan_input(1, 100_000, "small")


# --- hpccinf.txt layout -----------------------------------------------------------------


def test_input_file_layout_by_line_number() -> None:
    spec = plan_input(6, 24 * GIB, "small")
    lines = spec.render().splitlines()
    assert len(lines) == 36  # 31 HPL lines, separator, 4 PTRANS lines
    assert all(len(line) <= 80 for line in lines)  # hpcc reads 82-byte lines
    first = [line.split()[0] if line.split() else "" for line in lines]
    assert first[4] == "1" and first[5] == str(spec.n)  # lines 5-6: one N
    assert first[6] == "1" and first[7] == str(spec.nb)  # lines 7-8: one NB
    assert first[9] == "1" and (first[10], first[11]) == ("2", "3")  # lines 10-12: 2x3
    assert "separator" in lines[31]  # line 32
    assert first[32] == "0" and first[34] == "0"  # no extra PTRANS sizes or blocks


def test_input_file_round_trips() -> None:
    spec = plan_input(12, 64 * GIB, 0.5)
    assert HpccInput.from_text(spec.render()) == spec


@pytest.mark.skipif(not EXAMPLE_INPUT.exists(), reason="hpcc's example input not installed")
def test_reader_reads_hpccs_own_example_and_our_tuning_matches_it() -> None:
    example = HpccInput.from_text(EXAMPLE_INPUT.read_text())
    assert (example.n, example.nb, example.p, example.q) == (1000, 80, 2, 2)
    ours = HpccInput(n=1000, nb=80, p=2, q=2)
    assert ours == example  # our HPL tuning lines are hpcc's example's
    example_lines = EXAMPLE_INPUT.read_text().splitlines()
    ours_lines = ours.render().splitlines()
    for number in range(5, 32):  # every HPL value, position by position
        assert ours_lines[number - 1].split()[0] == example_lines[number - 1].split()[0]


def test_reader_rejects_a_short_file() -> None:
    text = "\n".join(plan_input(1, GIB).render().splitlines()[:31])
    with pytest.raises(ValueError, match="31 lines"):
        HpccInput.from_text(text)


# --- summary parsing on real output --------------------------------------------------


def test_real_np1_output_has_every_computational_metric() -> None:
    values = by_name(parse_output(fixture("np1-hpccoutf.txt")))
    assert set(values) == {m.name for m in METRICS}  # ping-pong needs 2 processes
    for value in values.values():
        assert value.ok and value.value is not None and value.value > 0, value


def test_real_np2_output_has_every_metric_including_communication() -> None:
    values = by_name(parse_output(fixture("np2-hpccoutf.txt")))
    assert set(values) == {m.name for m in METRICS + COMMUNICATION_METRICS}
    for value in values.values():
        assert value.ok and value.value is not None and value.value > 0, value


def test_summary_values_agree_with_the_sections_that_measured_them() -> None:
    """Cross-check against other parts of the same real file: HPL's result table
    (Gflops, %.3e) and STREAM's 'Average Triad GB/s' line (%f)."""
    text = fixture("np1-hpccoutf.txt")
    values = by_name(parse_output(text))
    hpl_row = re.search(r"^WR\S+\s+\d+\s+\d+\s+\d+\s+\d+\s+\S+\s+(\S+)$", text, re.M)
    assert hpl_row is not None
    assert values["HPL_Tflops"].value == pytest.approx(float(hpl_row[1]) / 1000, rel=1e-3)
    star = re.search(r"Begin of StarSTREAM.*?Average Triad GB/s (\S+)", text, re.S)
    assert star is not None
    assert values["StarSTREAM_Triad"].value == pytest.approx(float(star[1]), rel=1e-5)


def test_units_and_directions() -> None:
    units = {m.name: (m.unit, m.higher_is_better) for m in METRICS + COMMUNICATION_METRICS}
    assert units["HPL_Tflops"] == ("Tflop/s", True)
    assert units["StarSTREAM_Triad"] == ("GB/s", True)
    assert units["MPIRandomAccess_GUPs"] == ("GUP/s", True)
    assert units["MaxPingPongLatency_usec"] == ("us", False)
    assert units["RandomlyOrderedRingBandwidth_GBytes"] == ("GB/s", True)
    assert all(unit for unit, _ in units.values())


def test_real_failed_residual_run_is_a_failed_sample() -> None:
    with pytest.raises(ParseError, match=r"Success=0.*FAILED"):
        parse_output(fixture("np1-failed-residual-hpccoutf.txt"))


# --- synthetic edge cases --------------------------------------------------------------


def with_summary_line(key: str, value: str) -> str:
    """The real np=2 output with one summary value replaced."""
    text = fixture("np2-hpccoutf.txt")
    replaced, count = re.subn(rf"^{key}=.*$", f"{key}={value}", text, flags=re.M)
    assert count == 1
    return replaced


@pytest.mark.parametrize(
    ("raw", "expected"), [("1e-05", 1e-05), ("42", 42.0), ("3.5E+02", 350.0), ("0.25", 0.25)]
)
def test_g_formatted_values(raw: str, expected: float) -> None:
    values = by_name(parse_output(with_summary_line("PTRANS_GBs", raw)))
    assert values["PTRANS_GBs"].value == expected


@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "-nan"])
def test_non_finite_value_is_a_failed_metric_not_a_failed_run(raw: str) -> None:
    values = by_name(parse_output(with_summary_line("MPIFFT_Gflops", raw)))
    assert not values["MPIFFT_Gflops"].ok
    assert values["MPIFFT_Gflops"].error is not None
    assert values["HPL_Tflops"].ok


def test_minus_one_with_two_processes_is_a_failed_metric() -> None:
    values = by_name(parse_output(with_summary_line("AvgPingPongLatency_usec", "-1")))
    assert not values["AvgPingPongLatency_usec"].ok
    assert "did not measure" in (values["AvgPingPongLatency_usec"].error or "")


def test_garbage_value_is_a_failed_metric() -> None:
    values = by_name(parse_output(with_summary_line("StarDGEMM_Gflops", "fast")))
    assert not values["StarDGEMM_Gflops"].ok


def test_missing_key_is_a_failed_metric() -> None:
    text = re.sub(r"^SingleFFT_Gflops=.*\n", "", fixture("np1-hpccoutf.txt"), flags=re.M)
    values = by_name(parse_output(text))
    assert not values["SingleFFT_Gflops"].ok
    assert "missing" in (values["SingleFFT_Gflops"].error or "")


def test_missing_summary_is_a_failed_run() -> None:
    text = fixture("np1-hpccoutf.txt")
    cut = text[: text.index("Begin of Summary section.")]
    with pytest.raises(ParseError, match="no summary section"):
        parse_output(cut)


def test_truncated_summary_is_a_failed_run() -> None:
    text = fixture("np1-hpccoutf.txt")
    cut = text[: text.index("STREAM_VectorSize=")]
    with pytest.raises(ParseError, match="truncated"):
        parse_output(cut)


def test_empty_file_is_a_failed_run() -> None:
    with pytest.raises(ParseError):
        parse_output("")


def test_missing_success_flag_is_a_failed_run() -> None:
    text = re.sub(r"^Success=1\n", "", fixture("np1-hpccoutf.txt"), flags=re.M)
    with pytest.raises(ParseError, match="Success"):
        parse_output(text)


def test_appended_runs_use_the_last_summary() -> None:
    first = fixture("np1-hpccoutf.txt")
    second = with_summary_line("HPL_Tflops", "123")
    summary = read_summary(first + second)
    assert summary["HPL_Tflops"] == "123"
    assert summary["CommWorldProcs"] == "2"


# --- the suite's file handling -----------------------------------------------------------


def test_prepare_writes_input_removes_stale_output_and_runs_from_workdir(
    tmp_path: Path,
) -> None:
    (tmp_path / OUTPUT_FILE).write_text("stale output of an earlier run\n")
    argv = HpccSuite().prepare(tmp_path, 2, 24 * GIB)
    assert not (tmp_path / OUTPUT_FILE).exists()
    spec = HpccInput.from_text((tmp_path / INPUT_FILE).read_text())
    assert (spec.p, spec.q) == (1, 2)
    assert argv[:3] == ["/usr/bin/env", "-C", str(tmp_path)]
    assert argv[argv.index("-np") + 1] == "2"
    assert Path(argv[-1]).is_absolute() and Path(argv[-1]).name == "hpcc"


def test_parse_rejects_nonzero_exit_with_the_error_text(tmp_path: Path) -> None:
    (tmp_path / OUTPUT_FILE).write_text(fixture("np1-hpccoutf.txt"))
    with pytest.raises(ParseError, match=r"code 1: .*not enough slots"):
        HpccSuite().parse(tmp_path, "", "There are not enough slots available\n", 1)


def test_parse_without_output_file_is_a_failed_run(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match=r"no hpccoutf\.txt"):
        HpccSuite().parse(tmp_path, "", "", 0)


def test_parse_reads_the_output_file(tmp_path: Path) -> None:
    (tmp_path / OUTPUT_FILE).write_text(fixture("np2-hpccoutf.txt"))
    values = HpccSuite().parse(tmp_path, "", "", 0)
    assert len(values) == len(METRICS) + len(COMMUNICATION_METRICS)
    assert all(not math.isnan(v.value or math.nan) for v in values)


# --- the warm-up -----------------------------------------------------------------------


@pytest.mark.parametrize(("np", "memory"), [(1, 512 * MIB), (2, 24 * GIB), (4, 24 * GIB)])
def test_warm_up_is_an_eighth_of_the_matrix_on_the_same_blocks_and_grid(
    np: int, memory: int
) -> None:
    full = plan_input(np, memory, "small")
    warm = warmup_input(full)
    assert (warm.nb, warm.p, warm.q) == (full.nb, full.p, full.q)
    assert warm.n % (2 * warm.nb) == 0 and warm.n >= 2 * warm.nb
    assert warm.matrix_bytes <= full.matrix_bytes // 8 or warm.n == 2 * warm.nb
    assert warm.model_copy(update={"n": full.n}) == full  # nothing else changed


def test_the_smallest_matrix_warms_up_at_its_own_size() -> None:
    tiny = HpccInput(n=160, nb=80, p=1, q=1)
    assert warmup_input(tiny) == tiny


@pytest.mark.skipif(shutil.which("hpcc") is None, reason="hpcc is not installed")
def test_real_hpcc_runs_the_warm_up_input_and_reports_its_size(tmp_path: Path) -> None:
    """hpcc itself is the oracle: it runs every test on the warm-up input and says
    which N it used."""
    suite = HpccSuite()
    argv = suite.prepare_warmup(tmp_path, 1, 512 * MIB)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    values = by_name(suite.parse(tmp_path, done.stdout, done.stderr, done.returncode))
    assert set(values) == {m.name for m in METRICS}
    summary = read_summary((tmp_path / OUTPUT_FILE).read_text())
    assert int(summary["HPL_N"]) == warmup_input(plan_input(1, 512 * MIB, "small")).n
