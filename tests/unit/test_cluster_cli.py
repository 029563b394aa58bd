"""`hpcvm cluster` refusals that need no Slurm: bad input to the internal placement
role (``python -m hpcvm.cluster.internal placement``) and `down` of a cluster that does
not exist, each one line, nothing left in the runtime directory. (Clusters themselves
are tested under Slurm and the local batch system.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def hpcvm(
    *args: str, runtime: Path, module: str = "hpcvm.cli.main"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCVM_RUNTIME_DIR": str(runtime)}
    prefix = ["cluster"] if module == "hpcvm.cli.main" else []
    return subprocess.run(
        [sys.executable, "-m", module, *prefix, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def _left(runtime: Path) -> list[str]:
    return (
        sorted(str(p.relative_to(runtime)) for p in runtime.rglob("*")) if runtime.exists() else []
    )


def test_down_of_an_unknown_cluster_leaves_no_lock_file(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    done = hpcvm("down", "ghost", runtime=runtime)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "no cluster named 'ghost'" in done.stderr
    assert _left(runtime) == []


@pytest.mark.parametrize("config", ["{bad", "[]", '{"suites": 3}', ""])
def test_placement_with_bad_json_is_one_line(tmp_path: Path, config: str) -> None:
    done = hpcvm("placement", config, runtime=tmp_path / "rt", module="hpcvm.cluster.internal")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcvm: error: "), done.stderr
    assert "bench configuration" in lines[0]


@pytest.mark.parametrize("args", [[], ["nosuchrole"], ["node", "extra"], ["reaper"]])
def test_internal_roles_refuse_bad_calls_in_one_line(tmp_path: Path, args: list[str]) -> None:
    done = hpcvm(*args, runtime=tmp_path / "rt", module="hpcvm.cluster.internal")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcvm: error: "), done.stderr
