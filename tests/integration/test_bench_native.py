"""Suites run natively through their own prepare/argv/parse, with the real hpcc, Open MPI
and noise binary, as the orchestrator will run them.

Commands run with an EMPTY environment, the strictest case of what a command gets in a
guest (qemu-guest-agent's guest-exec passes on the agent's own, bare, environment): the
argv must work there exactly as natively.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcvm.bench.core.launch import mpirun_argv
from hpcvm.bench.core.metrics import ParseError
from hpcvm.bench.suites.cmd.suite import CmdSuite
from hpcvm.bench.suites.hpcc.suite import (
    COMMUNICATION_METRICS,
    INPUT_FILE,
    METRICS,
    HpccInput,
    HpccSuite,
    read_summary,
)
from hpcvm.bench.suites.hpcc.suite import OUTPUT_FILE as HPCC_OUTPUT
from hpcvm.bench.suites.noise.suite import NoiseSuite, parse_report, read_raw
from hpcvm.bench.suites.npb.suite import discover
from hpcvm.units import GIB

pytestmark = pytest.mark.integration

TIMEOUT = 900  # the machine is shared and slow; never a timed assertion
NPB_DATA = Path(__file__).resolve().parent.parent / "data" / "npb"


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env={}, timeout=TIMEOUT)


def allowed_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("np_", [1, 2])
def test_hpcc_native_small(tmp_path: Path, np_: int) -> None:
    if np_ > len(allowed_cpus()):
        pytest.skip(f"needs {np_} CPUs")
    suite = HpccSuite("small")
    suite.validate([np_])
    argv = suite.prepare(tmp_path, np_, 24 * GIB)
    result = run(argv)
    values = {
        v.name: v for v in suite.parse(tmp_path, result.stdout, result.stderr, result.returncode)
    }

    expected = METRICS + (COMMUNICATION_METRICS if np_ > 1 else ())
    assert set(values) == {m.name for m in expected}
    for value in values.values():
        assert value.ok and value.value is not None and value.value > 0, value

    # hpcc ran our input: its summary echoes the N and grid we wrote, and no failure.
    spec = HpccInput.from_text((tmp_path / INPUT_FILE).read_text())
    summary = read_summary((tmp_path / HPCC_OUTPUT).read_text())
    assert summary["Success"] == "1"
    assert summary["CommWorldProcs"] == str(np_)
    assert (summary["HPL_N"], summary["HPL_nprow"], summary["HPL_npcol"]) == (
        str(spec.n),
        str(spec.p),
        str(spec.q),
    )
    # --report-bindings: every rank was bound.
    assert result.stderr.count("bound to") == np_


def test_mpirun_as_root_binds_each_rank_to_its_own_cpu() -> None:
    cpus = allowed_cpus()
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    argv = mpirun_argv(2, ["/bin/grep", "Cpus_allowed_list", "/proc/self/status"])
    result = run(argv)
    assert result.returncode == 0, result.stderr
    lists = [line.split(":")[1].strip() for line in result.stdout.splitlines()]
    assert len(lists) == 2
    assert all(item.isdigit() for item in lists), lists  # one CPU each
    assert len(set(lists)) == 2  # different CPUs


def test_mpirun_refuses_more_ranks_than_cores() -> None:
    too_many = len(allowed_cpus()) + 1
    result = run(mpirun_argv(too_many, ["/bin/true"]))
    assert result.returncode != 0
    assert "not enough slots" in result.stdout + result.stderr


def _in_netns(argv: list[str], lo_up: bool) -> subprocess.CompletedProcess[str]:
    script = 'ip link set lo up && exec "$@"' if lo_up else 'exec "$@"'
    ip_dir = str(Path(shutil.which("ip") or "/usr/sbin/ip").parent)
    return subprocess.run(
        [shutil.which("unshare") or "unshare", "-n", "/bin/sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        env={"PATH": ip_dir},
        timeout=TIMEOUT,
    )


def test_mpirun_without_network_needs_only_loopback() -> None:
    """A guest has no network: Open MPI must work with just `lo` up (and, as measured,
    cannot start with no interface at all — the guest must bring `lo` up)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("unshare or ip missing")
    probe = subprocess.run(["unshare", "-n", "/bin/true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot create a network namespace here")
    argv = (
        mpirun_argv(2, ["/bin/true"]) if len(allowed_cpus()) > 1 else mpirun_argv(1, ["/bin/true"])
    )
    with_lo = _in_netns(argv, lo_up=True)
    assert with_lo.returncode == 0, with_lo.stderr
    without = _in_netns(argv, lo_up=False)
    assert without.returncode != 0


def test_noise_runs_on_every_cpu_and_its_summary_matches_its_raw_durations(
    tmp_path: Path,
) -> None:
    suite = NoiseSuite(quanta=2000, quantum_us=20)
    suite.validate([1])
    result = run(suite.prepare(tmp_path, 1, 0))
    values = {
        v.name: v for v in suite.parse(tmp_path, result.stdout, result.stderr, result.returncode)
    }
    cpus = allowed_cpus()
    for cpu in cpus:
        for metric in suite.metrics:
            assert values[f"{metric.name}@cpu{cpu}"].ok
    quantum = values["NoiseQuantum_usec"].value
    assert quantum is not None and quantum > 0

    report = parse_report(result.stdout)
    assert report.target_ns == 20_000 and report.quanta == 2000
    raw = read_raw(tmp_path / "noise-raw.txt")
    assert sorted(raw) == cpus == [c.cpu for c in report.cpus]
    for line in report.cpus:
        durations = np.array(raw[line.cpu], dtype=np.int64)
        assert len(durations) == 2000
        assert line.min_ns == durations.min()
        assert line.max_detour_ns == durations.max() - durations.min()


def test_noise_on_a_cpu_it_may_not_use_is_a_failed_run(tmp_path: Path) -> None:
    missing = max(allowed_cpus()) + 1
    suite = NoiseSuite(quanta=10, cpus=[missing])
    result = run(suite.prepare(tmp_path, 1, 0))
    assert result.returncode != 0
    with pytest.raises(ParseError, match=f"cannot run on CPU {missing}"):
        suite.parse(tmp_path, result.stdout, result.stderr, result.returncode)


def test_npb_suite_runs_a_binary_under_mpirun(tmp_path: Path) -> None:
    """No NPB binary exists here (not packaged): a stand-in replays a recorded real NPB
    3.4 CG class S run on 2 processes (tests/data/npb/README.md says how it was made)."""
    if len(allowed_cpus()) < 2:
        pytest.skip("needs 2 CPUs")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "cg.S.x"
    stand_in.write_text(
        f"#!/bin/sh\nexec {sys.executable} {NPB_DATA / 'npb_standin.py'} "
        f"{NPB_DATA / 'real' / 'npb3.4-cg.S.x-np2'}\n"
    )
    stand_in.chmod(0o755)
    (suite,) = discover(bin_dir, ["cg"], size="quick")
    suite.validate([2])
    result = run(suite.prepare(tmp_path / "work", 2, 0))
    values = suite.parse(tmp_path / "work", result.stdout, result.stderr, result.returncode)
    assert [(v.name, v.value) for v in values] == [("Time_sec", 0.09), ("Mops_total", 735.27)]


def test_cmd_suite_runs_from_the_users_directory(tmp_path: Path) -> None:
    (tmp_path / "input.txt").write_text("0.125\n")
    suite = CmdSuite(
        "/bin/sh -c 'echo Time: $(cat input.txt) s'",
        r"Time: ([0-9.]+) s",
        higher_is_better=False,
        cwd=tmp_path,
    )
    suite.validate([1])
    result = run(suite.prepare(tmp_path / "work", 1, 0))
    (value,) = suite.parse(tmp_path / "work", result.stdout, result.stderr, result.returncode)
    assert value.value == 0.125
