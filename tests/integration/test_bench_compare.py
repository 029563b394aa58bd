"""`hpcvm bench` on this machine with real VMs (TCG), real hpcc, Open MPI and the noise
benchmark: the issue's "Done when" comparison, and Ctrl-C followed by --resume.

Sizes are small so that three environments x (hpcc np 1, hpcc np 2, noise) x (warm-up +
3 repetitions) finish in minutes under TCG on this shared 2-core machine. Nothing here
asserts a time or a speed; every expected figure is recomputed from the database's raw
values, independently of hpcvm's summaries.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hpcvm.bench.envs.vm import plan_vm
from hpcvm.bench.suites.hpcc.suite import COMMUNICATION_METRICS
from hpcvm.bench.suites.hpcc.suite import METRICS as HPCC_METRICS
from hpcvm.bench.suites.noise.suite import METRICS as NOISE_METRICS
from hpcvm.store import Store
from hpcvm.units import MIB
from tests.integration.conftest import HugePages
from tests.runtime_support import Residue, assert_nothing_left, interruptible

pytestmark = pytest.mark.integration

HPCVM = [sys.executable, "-m", "hpcvm.cli.main"]
VM_MEMORY = 512 * MIB
ENVS = ("native", "vm:naive", "vm:numa")
BENCH_TIMEOUT = 3600  # generous: the machine is shared and TCG is slow
PAGE_2M = 2 * MIB


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private runtime directory for the VMs; checked empty afterwards."""
    directory = tmp_path / "runtime"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("HPCVM_RUNTIME_DIR", str(directory))
    yield directory


def _reserve_for_numa(hugepages: HugePages, guest_nodes: int = 2) -> None:
    plan, _ = plan_vm("numa", vcpus=2, memory_bytes=VM_MEMORY, guest_nodes=guest_nodes)
    hugepages.ensure_free(PAGE_2M, sum(plan.hugepages_needed.values()))


def _run(args: list[str], timeout: float = BENCH_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCVM, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_native_vs_naive_vs_numa_hpcc_and_noise(
    tmp_path: Path, runtime_dir: Path, hugepages: HugePages
) -> None:
    _reserve_for_numa(hugepages)
    before = Residue.take(runtime_dir)
    out = tmp_path / "results"
    env_args = [a for e in ENVS for a in ("--env", e)]
    bench = _run(
        [
            "bench",
            *env_args,
            "--vm-guest-nodes",
            "2",
            "--vm-memory",
            "512M",
            "--suite",
            "hpcc",
            "--suite",
            "noise",
            "--np",
            "1,2",
            "--reps",
            "3",
            "--size",
            "0.002",
            "--noise-quanta",
            "2000",
            "--seed",
            "42",
            "--out",
            str(out),
        ]
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert_nothing_left(before)

    # The database: one finished run, every environment, warm-up + 3 per cell.
    with Store.open(out) as store:
        run = store.run()
        envs = {e.name: e for e in store.environments(run.id)}
        samples = store.samples(run.id)
    assert (run.status, run.stop_reason, run.seed) == ("finished", "fixed", 42)
    assert set(envs) == set(ENVS)
    assert envs["native"].accel == "native"
    assert envs["vm:naive"].accel == envs["vm:numa"].accel == "tcg"
    numa_plan = envs["vm:numa"].plan
    assert numa_plan is not None and len(numa_plan["guest_nodes"]) == 2
    cells = [("hpcc", 1), ("hpcc", 2), ("noise", None)]
    for env in ENVS:
        for suite, np_ in cells:
            mine = [s for s in samples if (s.env, s.suite, s.np) == (env, suite, np_)]
            assert sorted((s.warmup, s.repetition) for s in mine) == [
                (False, 0),
                (False, 1),
                (False, 2),
                (True, 0),
            ], (env, suite, np_)
    for s in samples:
        if s.env != "native" and s.ok:
            assert "guest" in s.evidence["interrupts"], s.log_path
            assert s.evidence["clock"].get("host_seconds", 0) > 0
        assert s.log_path is not None and Path(s.log_path).is_file()

    # The JSON: every env x suite x np x metric, n = ok samples, overhead rules, TCG.
    results = _run(["results", str(out), "--json"], timeout=600)
    assert results.returncode == 0, results.stderr
    rows = json.loads(results.stdout)
    by_key = {(r["env"], r["suite"], r["np"], r["metric"]): r for r in rows}
    expected = {
        ("hpcc", 1): [m.name for m in HPCC_METRICS],
        ("hpcc", 2): [m.name for m in HPCC_METRICS + COMMUNICATION_METRICS],
        ("noise", None): [m.name for m in NOISE_METRICS],
    }
    for env in ENVS:
        for (suite, np_), names in expected.items():
            for name in names:
                row = by_key.get((env, suite, np_, name))
                assert row is not None, (env, suite, np_, name)
                values = [
                    m.value
                    for s in samples
                    if (s.env, s.suite, s.np) == (env, suite, np_) and s.ok and not s.warmup
                    for m in s.metrics
                    if m.metric == name and m.value is not None
                ]
                assert row["n"] == len(values)
                if values:
                    assert row["mean"] == pytest.approx(float(np.mean(values)))
                if env == "native":
                    assert row["overhead_pct"] is None and row["significant"] is None
                else:
                    assert any(w.startswith("TCG") for w in row["warnings"])
                    assert row["accel"] == "tcg"
                    if row["overhead_pct"] is not None:
                        lo, hi = row["overhead_ci_low"], row["overhead_ci_high"]
                        assert lo <= row["overhead_pct"] <= hi
                        assert row["significant"] == (lo > 0 or hi < 0)
    ok_measured = [s for s in samples if not s.warmup and s.ok]
    assert len(ok_measured) >= 0.8 * len(ENVS) * len(cells) * 3  # a few may fail under load

    # The table and the exports agree with the database.
    for env in ENVS:
        assert env in bench.stdout
    assert "TCG" in bench.stdout and "hpcc: HPL_Tflops" in bench.stdout
    assert "noise: NoiseTimeLost_pct" in bench.stdout
    exported = json.loads((out / "summary.json").read_text())
    assert {(r["env"], r["suite"], r["np"], r["metric"]) for r in exported} == set(by_key)
    assert (out / "samples.csv").is_file()


def _count_samples(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return int(conn.execute("SELECT count(*) FROM samples").fetchone()[0])
    except sqlite3.Error:
        return 0


def test_ctrl_c_brings_vms_down_keeps_samples_and_resume_completes(
    tmp_path: Path, runtime_dir: Path
) -> None:
    before = Residue.take(runtime_dir)
    out = tmp_path / "results"
    args = [
        "bench",
        "--env",
        "native",
        "--env",
        "vm:naive",
        "--cmd",
        "/bin/sh -c 'sleep 0.5; echo Time: 1.$$ s'",
        "--metric",
        r"Time: ([0-9.]+) s",
        "--lower-is-better",
        "--reps",
        "8",
        "--vm-memory",
        "512M",
        "--seed",
        "5",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [*HPCVM, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        deadline = time.monotonic() + 900
        while _count_samples(out / "hpcvm.db") < 5:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no samples within 900 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert_nothing_left(before)

    with Store.open(out) as store:
        run = store.run()
        kept = store.samples(run.id)
    assert run.status == "interrupted"
    assert 5 <= len(kept) < 18  # 2 envs x (warm-up + 8)
    assert all(Path(str(s.log_path)).is_file() for s in kept)

    resumed = _run(["bench", "--resume", "--out", str(out)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_nothing_left(before)
    with Store.open(out) as store:
        (again,) = store.runs()
        samples = store.samples(again.id)
    assert (again.status, again.seed) == ("finished", 5)
    keys = [s.key for s in samples]
    assert len(keys) == len(set(keys))
    assert {s.key for s in kept} <= set(keys)
    measured = sorted((s.env, s.repetition) for s in samples if not s.warmup)
    assert measured == sorted((e, r) for e in ("native", "vm:naive") for r in range(8))
    assert os.path.isdir(out / "logs")
