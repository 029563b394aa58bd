"""The netpipe suite against real NetPIPE output (tests/data/netpipe/README.md says how
each file was recorded).

The oracle for the values is NetPIPE's own progress lines on stderr ("N bytes ... -->
R Mbps in T usec"), printed from the same measurement but independently of the output
file the suite reads; the oracle for where the ranks ran is Open MPI's --report-bindings
lines. Failures are NetPIPE's own refusals, recorded, and cut or garbled copies of the
real file.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from hpcvm.bench.core.metrics import MetricValue, ParseError
from hpcvm.bench.suites.netpipe.suite import (
    MAX_BYTES,
    METRICS,
    OUTPUT_FILE,
    RANKS,
    SIZES,
    NetpipeSuite,
    read_points,
    size_name,
)
from hpcvm.bench.suites.registry import SuiteOptions, build_suites, kind_of, message_bytes
from hpcvm.errors import BenchmarkError, UsageError

DATA = Path(__file__).parent.parent / "data" / "netpipe"
PROGRESS = re.compile(r"^\s*\d+:\s+(\d+) bytes\s+\d+ times -->\s+([\d.]+) Mbps in\s+([\d.]+) usec")


def _read(name: str) -> str:
    return (DATA / name).read_text()


def _run(tmp_path: Path, np_out: str | None, prefix: str = "quick") -> list[MetricValue]:
    if np_out is not None:
        (tmp_path / OUTPUT_FILE).write_text(np_out)
    rc_file = DATA / f"{prefix}.rc"
    rc = int(rc_file.read_text()) if rc_file.exists() else 0
    return NetpipeSuite("quick").parse(
        tmp_path, _read(f"{prefix}.stdout"), _read(f"{prefix}.stderr"), rc
    )


def _progress() -> dict[int, tuple[float, float]]:
    """size -> (Mbps as NetPIPE prints it, usec) from the progress lines."""
    out = {}
    for line in _read("quick.stderr").splitlines():
        m = PROGRESS.match(line)
        if m:
            out[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return out


def test_a_real_run_gives_every_metric(tmp_path: Path) -> None:
    values = _run(tmp_path, _read("quick.np.out"))
    assert [v.name for v in values] == [m.name for m in METRICS]
    assert all(v.ok for v in values), [v.error for v in values if not v.ok]
    assert len(values) == 2 * len(SIZES) + 1
    sized = [v for v in values if v.metric.message_bytes is not None]
    assert sorted({v.metric.message_bytes or 0 for v in sized}) == list(SIZES)


def test_values_agree_with_netpipes_own_progress_lines(tmp_path: Path) -> None:
    progress = _progress()
    assert set(SIZES) <= set(progress)
    got = {v.name: v.value for v in _run(tmp_path, _read("quick.np.out"))}
    for nbytes in SIZES:
        mbps, usec = progress[nbytes]
        latency = got[f"latency_{size_name(nbytes)}"]
        bandwidth = got[f"bandwidth_{size_name(nbytes)}"]
        assert latency is not None and bandwidth is not None
        assert latency == pytest.approx(usec, abs=0.006)  # printed with 2 decimals
        # NetPIPE's "Mbps" is 2^20 bit/s; the suite reports 10^6 bit/s
        assert bandwidth == pytest.approx(mbps * 1.048576, rel=1e-3, abs=0.01)
        assert bandwidth == pytest.approx(8 * nbytes / latency, rel=1e-9)
    peak = max(mbps for mbps, _ in progress.values()) * 1.048576
    assert got["peak_bandwidth"] == pytest.approx(peak, rel=1e-3)


def test_rank_hosts_match_open_mpis_bindings(tmp_path: Path) -> None:
    (tmp_path / OUTPUT_FILE).write_text(_read("quick.np.out"))
    facts = NetpipeSuite("quick").sample_facts(
        tmp_path, _read("quick.stdout"), _read("quick.stderr"), 0
    )
    bound = dict(re.findall(r"\[([^:\]]+):\d+\] MCW rank (\d) bound", _read("quick.stderr")))
    hosts = {rank: host for host, rank in bound.items()}
    assert facts["rank0_host"] == hosts.get("0", next(iter(bound)))
    assert facts["rank1_host"] == hosts.get("1", next(iter(bound)))
    progress = _progress()
    best = max(progress, key=lambda n: progress[n][0])
    assert facts["peak_bandwidth_at"] == size_name(best)


def test_a_cut_file_is_a_failed_run(tmp_path: Path) -> None:
    lines = _read("quick.np.out").splitlines(keepends=True)
    with pytest.raises(ParseError, match=r"ends at .*before 1MiB.*cut short"):
        _run(tmp_path, "".join(lines[:20]))


def test_netpipes_time_limit_fails_only_the_sizes_it_did_not_reach(tmp_path: Path) -> None:
    # Constructed (no run here is slow enough): the real file up to 128 KiB, then one
    # 256 KiB line whose 0.2 s one-way time is over NetPIPE's limit (rate = bits / t / 2^20).
    kept = [ln for ln in _read("quick.np.out").splitlines() if int(ln.split()[0]) <= 131072]
    rate = 8 * 262144 / 0.2 / 2**20
    text = "\n".join([*kept, f"  262144 {rate:f}   0.20000000"]) + "\n"
    values = {v.name: v for v in _run(tmp_path, text)}
    assert values["latency_256KiB"].value == pytest.approx(2e5)
    failed = values["bandwidth_1MiB"]
    assert not failed.ok and failed.error is not None and "time limit" in failed.error
    assert values["peak_bandwidth"].ok


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        ("\n", "\n  garbage here\n", "expected 'bytes Mbps seconds'"),
        ("   0.0000", "   O.OOOO", "not numbers"),
        (" 0.", " 9.", "time column says"),
    ],
)
def test_garbled_lines_are_named(tmp_path: Path, old: str, new: str, match: str) -> None:
    text = _read("quick.np.out").replace(old, new, 1)
    assert text != _read("quick.np.out")
    with pytest.raises(ParseError, match=match):
        _run(tmp_path, text)


def test_an_empty_or_missing_file_fails(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match="empty"):
        _run(tmp_path, "")
    (tmp_path / OUTPUT_FILE).unlink()
    with pytest.raises(ParseError, match=f"wrote no {OUTPUT_FILE}"):
        _run(tmp_path, None)


@pytest.mark.parametrize(
    ("prefix", "said"),
    [
        ("one-rank", "Need at least two processes (only given 1)"),
        ("bad-bounds", "Start MUST be LESS than end"),
        (
            "slots",
            "There are not enough slots available in the system to satisfy the 2 slots that "
            "were requested by the application: NetPIPE always runs 2 ranks",
        ),
    ],
)
def test_netpipes_own_refusal_is_the_reason(tmp_path: Path, prefix: str, said: str) -> None:
    with pytest.raises(ParseError) as caught:
        _run(tmp_path, None, prefix)
    message = str(caught.value)
    assert said in message and "exited with code" in message
    assert "Primary job" not in message and "Using no perturbations" not in message
    assert "\n" not in message  # one line


def test_registry_builds_a_two_rank_suite_whatever_the_np(tmp_path: Path) -> None:
    if shutil.which("NPopenmpi") is None:
        pytest.skip("netpipe-openmpi is not installed (scripts/setup.sh installs it)")
    (suite,) = build_suites(["netpipe"], SuiteOptions(netpipe_size="quick"))
    assert isinstance(suite, NetpipeSuite) and not suite.uses_np
    suite.validate([1, 4])  # --np does not apply: nothing to refuse
    for np in (1, 8):
        argv = suite.prepare(tmp_path, np, 1 << 30)
        assert argv[argv.index("-np") + 1] == str(RANKS)
        assert argv[argv.index("-u") + 1] == str(MAX_BYTES)
        assert argv[argv.index("-n") + 1] == "20"  # quick: the documented smoke size
    kind = kind_of("netpipe")
    assert kind is not None and "netpipe-openmpi" in kind.packages
    assert message_bytes("netpipe", "latency_4KiB") == 4096
    assert message_bytes("netpipe", "peak_bandwidth") is None
    assert message_bytes("hpcc", "HPL_Tflops") is None


def test_medium_leaves_repetitions_to_netpipe(tmp_path: Path) -> None:
    if shutil.which("NPopenmpi") is None:
        pytest.skip("netpipe-openmpi is not installed (scripts/setup.sh installs it)")
    argv = NetpipeSuite("medium").prepare(tmp_path, 2, 1 << 30)
    assert "-n" not in argv  # mpirun's own count is "-np"
    assert NetpipeSuite("medium").resolution("latency_1B") is None
    assert NetpipeSuite("quick").resolution("latency_1B") == pytest.approx(0.5 / 20)


def test_unknown_size_and_missing_program_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="quick, small, medium"):
        NetpipeSuite("huge")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BenchmarkError, match="netpipe-openmpi"):
        NetpipeSuite("small").validate([2])


def test_a_slow_links_rates_with_few_digits_are_read_from_the_time_column() -> None:
    """A real output file from two TCG guests (tests/data/netpipe/README.md): every
    line's two columns agree within their printed roundings, and where the rate has
    few digits left the time column is the one kept (to its 10 ns step)."""
    text = _read("vm-tcg.np.out")
    points = read_points(text)
    assert points[0].seconds == 0.00264931  # "1 0.002880 0.00264931": the time column
    assert len(points) == len(text.splitlines())
    for point, line in zip(points, text.splitlines(), strict=True):
        size, rate, printed = line.split()
        assert point.nbytes == int(size)
        # within both columns' roundings (10 ns steps; 6 decimals of the rate)
        assert point.seconds == pytest.approx(
            float(printed), abs=0.5e-8 + float(printed) * 0.5e-6 / float(rate) + 1e-12
        )
        assert point.mbit_s * 1e6 == pytest.approx(
            float(rate) * 2**20, rel=0.5e-6 / float(rate) + 1e-5
        )
