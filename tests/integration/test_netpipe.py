"""``hpcvm bench --suite netpipe`` natively, end to end: real NetPIPE under real Open MPI,
the results database and its summary, and the report with its message-size figure.

Oracles: every stored value is recomputed from the NetPIPE output file each sample left
in its work directory, read here with numpy rather than the suite's parser (bandwidth is
NetPIPE's rate column, in 2^20 bit/s, over 10^6; latency the message's bits over it);
the ranks' host is this machine's name. One run of 2 repetitions and a warm-up, about a
minute on a loaded 2-core host; no VM (NetPIPE in a guest needs 2 vCPUs, which the
shared 2-core test host cannot spare beside its housekeeping).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest

from hpcvm.bench.suites.netpipe.suite import METRICS, OUTPUT_FILE
from tests.runtime_support import hpcvm

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("NPopenmpi") is None:
        pytest.skip("netpipe-openmpi is not installed (scripts/setup.sh installs it)")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("NetPIPE runs 2 ranks: needs 2 CPUs")
    out = tmp_path_factory.mktemp("netpipe")
    bench = hpcvm(
        "bench",
        "--suite",
        "netpipe",
        "--env",
        "native",
        "--reps",
        "2",
        "--size",
        "quick",
        "--out",
        str(out),
        timeout=900,
    )
    assert bench.returncode == 0, bench.stderr
    return out


def _expected(workdir: Path) -> dict[str, float]:
    """metric -> value recomputed from one sample's own NetPIPE output file."""
    table = np.loadtxt(workdir / OUTPUT_FILE, ndmin=2)
    mbit_s = {int(b): rate * 2**20 / 1e6 for b, rate, _ in table}
    values = {"peak_bandwidth": max(mbit_s.values())}
    for m in METRICS:
        if m.message_bytes is not None:
            bw = mbit_s[m.message_bytes]
            values[m.name] = bw if m.higher_is_better else 8 * m.message_bytes / bw
    return values


def test_every_metric_is_stored_as_netpipe_measured_it(out: Path) -> None:
    samples = [s for s in json.loads((out / "samples.json").read_text()) if not s["warmup"]]
    assert len(samples) == 2 and all(s["ok"] and s["np"] is None for s in samples)
    per_sample = [_expected(Path(s["workdir"])) for s in samples]
    for s, expected in zip(samples, per_sample, strict=True):
        stored = {m["metric"]: m["value"] for m in s["metrics"]}
        assert set(stored) == {m.name for m in METRICS}
        for name, value in expected.items():
            assert stored[name] == pytest.approx(value, rel=1e-6), name
        facts = s["evidence"]["facts"]
        assert facts["rank0_host"] == facts["rank1_host"] == socket.gethostname()

    result = hpcvm("results", str(out), "--json")
    assert result.returncode == 0, result.stderr
    rows = {r["metric"]: r for r in json.loads(result.stdout) if r["suite"] == "netpipe"}
    assert set(rows) == {m.name for m in METRICS}
    for name, row in rows.items():
        assert row["n"] == 2
        assert row["mean"] == pytest.approx(np.mean([e[name] for e in per_sample]), rel=1e-6)


def test_the_report_shows_latency_and_bandwidth_against_message_size(out: Path) -> None:
    report = hpcvm("report", str(out), "--format", "md", "--format", "json", timeout=600)
    assert report.returncode == 0, report.stderr
    figures = json.loads((out / "report" / "report.json").read_text())["figures"]
    sizes = [f for f in figures if f["kind"] == "sizes"]
    assert [f["path"] for f in sizes] == ["figures/sizes-netpipe.png"]
    assert (out / "report" / sizes[0]["path"]).read_bytes()[:8] == PNG_MAGIC
    assert "figures/sizes-netpipe.png" in (out / "report" / "report.md").read_text()
