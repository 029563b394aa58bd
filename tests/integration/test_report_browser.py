"""The report of a real small run on this machine, opened in headless Chromium.

The run is real: ``hpcvm bench`` with native against a vm:naive guest (TCG here), the
noise suite and a dd command, 3 repetitions (about half a minute). The checks compare
the report with the bench's own exports (summary.json), then load the HTML in Debian's
chromium: a screenshot must be written, and every embedded figure must have loaded
(each ``<img>`` records its decoded width on load; the DOM after load shows it) with the
width of the PNG file it came from.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from hpcvm.store import Store

pytestmark = pytest.mark.integration

HPCVM = str(Path(sys.executable).with_name("hpcvm"))
CHROMIUM = shutil.which("chromium")
WINDOW = (1400, 3000)
ENVS = ("native", "vm:naive")


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


class Images(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: list[dict[str, str | None]] = []
        self.rows: list[tuple[str | None, str | None]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "img":
            self.images.append(found)
        if tag == "tr" and "data-metric" in found:
            self.rows.append((found["data-env"], found["data-metric"]))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "results"
    argv = [HPCVM, "bench", *(a for env in ENVS for a in ("--env", env))]
    argv += ["--suite", "noise", "--suite", "cmd", "--reps", "3", "--noise-quanta", "2000"]
    argv += ["--cmd", "dd if=/dev/zero of=/dev/null bs=1M count=64"]
    argv += ["--metric", r"copied, ([0-9.eE+-]+) s", "--lower-is-better", "--unit", "s"]
    argv += ["--metric-name", "dd_s", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def report(results: Path) -> dict[str, Path]:
    argv = [HPCVM, "report", str(results), "--format", "html", "--format", "md"]
    done = subprocess.run([*argv, "--format", "json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    printed = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    return {kind: Path(printed[kind]) for kind in ("html", "md", "json")}


def test_report_holds_every_environment_and_metric_of_the_run(
    results: Path, report: dict[str, Path]
) -> None:
    summary = json.loads((results / "summary.json").read_text())
    expected = {(r["env"], r["metric"]) for r in summary}
    assert {env for env, _ in expected} == set(ENVS)
    page = Images(report["html"].read_text())
    assert set(page.rows) == expected
    assert len(page.rows) == len(summary)
    md = report["md"].read_text()
    for r in summary:
        assert r["metric"] in md and r["env"] in md
    data = json.loads(report["json"].read_text())
    figures = {f["kind"]: report["html"].parent / f["path"] for f in data["figures"]}
    # Two suites: the every-environment figure (overview) is drawn beside the per-suite ones.
    assert set(figures) == {"overhead", "overview", "absolute", "interrupts", "noise"}
    for path in figures.values():
        assert imread(path).shape[1] > 300
    assert {c["env"] for c in data["report"]["noise"]} == set(ENVS)  # guest raw copied back


def test_tcg_runs_are_warned(results: Path, report: dict[str, Path]) -> None:
    with Store.open(results) as store:
        accel = {e.name: e.accel for e in store.environments(store.run().id)}
    if accel["vm:naive"] != "tcg":
        pytest.skip(f"vm:naive ran with {accel['vm:naive']}, not TCG")
    html = report["html"].read_text()
    assert 'class="warn tcg"' in html
    assert "vm:naive ran under TCG (software emulation)" in html


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "Debian chromium is not installed: run scripts/setup.sh"
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *args,
    ]
    env = {**os.environ, "HOME": str(profile)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)


def test_chromium_shows_the_report_with_every_image_loaded(
    report: dict[str, Path], tmp_path: Path
) -> None:
    url = report["html"].absolute().as_uri()
    shot = tmp_path / "report.png"
    window = f"--window-size={WINDOW[0]},{WINDOW[1]}"
    done = _chromium([f"--screenshot={shot}", window, url], tmp_path / "profile1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert png_size(shot.read_bytes()) == WINDOW
    pixels = imread(shot)[..., :3]
    assert float(np.std(pixels)) > 0.05  # something is drawn, not a blank page

    budget = ["--virtual-time-budget=10000", "--run-all-compositor-stages-before-draw"]
    done = _chromium([*budget, "--dump-dom", url], tmp_path / "profile2")
    assert done.returncode == 0, done.stderr[-2000:]
    images = Images(done.stdout).images
    figures = json.loads(report["json"].read_text())["figures"]
    assert sorted(img["data-figure"] or "" for img in images) == sorted(f["path"] for f in figures)
    for img in images:
        name = img["data-figure"]
        assert name is not None
        width, _ = png_size((report["html"].parent / name).read_bytes())
        assert img.get("data-loaded") == str(width), (name, img.get("data-loaded"))
