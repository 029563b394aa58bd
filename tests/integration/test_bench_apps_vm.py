"""Both application suites in a real guest: ``hpcvm bench --suite openfoam --suite
lammps --env native --env vm:naive`` under TCG, with 1 vCPU and np 1 at the smallest
size, then ``hpcvm report``.

What it shows: the OpenFOAM case prepared once on the host (results directory outside
the working directory, so the guest reads it through the inputs share) solves in the
guest with the very residuals of the native reference, LAMMPS's final energy in the
guest is native's, each VM sample counts, and the report draws both suites. Oracles: the
residuals and energy are read here from the reference runs' own logs with plain string
splitting; the VM's guest kernel facts come from the store. About a minute under TCG
on a shared 2-core host (one VM boot, 2 suites x 2 environments x 3 samples).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime_support import Residue, assert_nothing_left, hpcvm

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    for program, package in (("icoFoam", "openfoam"), ("lmp", "lammps")):
        if shutil.which(program) is None:
            pytest.skip(f"{package} is not installed (scripts/setup.sh installs it)")
    runtime = tmp_path_factory.mktemp("runtime")
    runtime.chmod(0o700)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HPCVM_RUNTIME_DIR", str(runtime))
        before = Residue.take(runtime)
        out = tmp_path_factory.mktemp("apps") / "results"
        bench = hpcvm(
            "bench", "--suite", "openfoam", "--suite", "lammps", "--env", "native",
            "--env", "vm:naive", "--np", "1", "--vm-vcpus", "1", "--vm-memory", "512M",
            "--size", "quick", "--reps", "2", "--out", str(out),
            timeout=1800,
        )  # fmt: skip
        assert bench.returncode == 0, bench.stderr
        assert_nothing_left(before)
        yield out


def _samples(out: Path) -> list[dict[str, object]]:
    samples: list[dict[str, object]] = json.loads((out / "samples.json").read_text())
    return samples


def _reference_residuals(out: Path) -> str:
    """The last step's initial residuals of the native reference run, from its log."""
    log = (out / "inputs" / "openfoam" / "mesh" / "log.reference").read_text()
    steps = log.split("\nTime = ")
    last = [line for line in steps[-1].splitlines() if "Solving for" in line]
    parts = [
        (line.split("Solving for ")[1].split(",")[0], line.split("Initial residual = ")[1])
        for line in last
    ]
    return ", ".join(f"{field} {float(value.split(',')[0]):g}" for field, value in parts)


def _reference_energy(out: Path) -> float:
    lines = (out / "inputs" / "lammps" / "np1" / "log.reference").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Loop time of"))
    header = next(lines[i].split() for i in range(at, -1, -1) if lines[i].startswith("Step "))
    return float(lines[at - 1].split()[header.index("TotEng")])


def test_every_sample_in_the_guest_gives_natives_answer(out: Path) -> None:
    samples = _samples(out)
    envs = {s["env"] for s in samples}
    assert envs == {"native", "vm:naive"}
    assert all(s["ok"] for s in samples), [s["error"] for s in samples if not s["ok"]]
    residuals = _reference_residuals(out)
    energy = _reference_energy(out)
    for s in samples:
        facts = s["evidence"]["facts"]  # type: ignore[index]
        if s["suite"] == "openfoam":  # --size quick: the tutorial's 20 x 20 mesh
            assert (facts["residuals"], facts["mesh"]) == (residuals, "20x20")
        else:  # --size quick: 5 x 5 x 5 fcc cells
            assert (float(facts["total_energy"]), facts["atoms"]) == (energy, "500")
    vm = [s for s in samples if s["env"] == "vm:naive"]
    assert len(vm) == 6  # 2 suites x (warm-up + 2)
    assert all(s["guest_seconds"] for s in vm)


def test_the_inputs_were_prepared_outside_the_working_directory(out: Path) -> None:
    """The results directory is a temporary one, so the guest read the prepared case
    through the inputs share, not through the shared working directory."""
    assert not out.is_relative_to(Path.cwd())
    assert (out / "inputs" / "openfoam" / "mesh" / "constant" / "polyMesh" / "owner").is_file()


def _comparable(out: Path, suite: str) -> bool:
    """Whether some metric of ``suite`` has an overhead to draw, read from the raw
    samples: native values whose mean is not zero, and VM values. At --size quick
    OpenFOAM's native CPU time per step can print as 0 in every repetition (its timer
    counts 0.01 s; a fast day's 19 steps take less): its overhead is then undefined."""
    values: dict[tuple[str, str], list[float]] = {}
    for s in _samples(out):
        if s["suite"] != suite or s["warmup"] or not s["ok"]:
            continue
        for m in s["metrics"]:  # type: ignore[attr-defined]
            if m["value"] is not None:
                values.setdefault((str(s["env"]), m["metric"]), []).append(m["value"])
    return any(
        env == "native" and sum(v) != 0 and ("vm:naive", metric) in values
        for (env, metric), v in values.items()
    )


def test_the_report_draws_both_suites(out: Path) -> None:
    """Each suite's absolute figure, and its overhead figure wherever the samples give
    an overhead; where native's mean is zero the report says why there is none."""
    report = hpcvm("report", str(out), "--format", "md", "--format", "json", timeout=600)
    assert report.returncode == 0, report.stderr
    figures = json.loads((out / "report" / "report.json").read_text())["figures"]
    paths = {f["path"] for f in figures}
    markdown = (out / "report" / "report.md").read_text()
    comparable = {suite: _comparable(out, suite) for suite in ("openfoam", "lammps")}
    assert comparable["lammps"]  # its loop time is never printed as zero
    for suite, has_overhead in comparable.items():
        drawn = ["absolute"]
        if has_overhead:
            drawn.append("overhead")
        else:
            assert f"figures/overhead-{suite}.png" not in paths, paths
            assert "overhead undefined: the native mean is zero" in markdown, markdown
        for kind in drawn:
            path = f"figures/{kind}-{suite}.png"
            assert path in paths
            assert (out / "report" / path).read_bytes()[:8] == PNG_MAGIC
    assert re.search(r"OpenFOAM CPU/step", markdown) and "LAMMPS loop" in markdown
