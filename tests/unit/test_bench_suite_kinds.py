"""A suite kind owns its options (bench/core/kind.py, bench/core/flags.py): its values
reach its own suite only, a run's identity leaves calibrated values out, a run recorded
with the earlier flat options still reads, and two kinds cannot own one flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.bench.core.flags import SuiteFlag
from hpcvm.bench.core.kind import SuiteKind
from hpcvm.bench.core.suite import Suite
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.suites.bsp.suite import BspSuite
from hpcvm.bench.suites.noise.suite import NoiseSuite
from hpcvm.bench.suites.registry import (
    REGISTRY,
    SuiteOptions,
    build_suites,
    guest_dirs,
    register,
    settled,
)


def test_flat_keys_of_an_earlier_record_are_the_kinds_values() -> None:
    recorded = {"bind": "none", "noise_quanta": 300, "bsp_steps": 10, "cmd_mpi": False}
    options = SuiteOptions.model_validate(recorded)
    assert options.bind == "none"
    assert options.values == {"noise_quanta": 300, "bsp_steps": 10, "cmd_mpi": False}
    noise, bsp = build_suites(["noise", "bsp"], options)
    assert isinstance(noise, NoiseSuite) and noise.quanta == 300
    assert isinstance(bsp, BspSuite) and bsp.steps == 10 and bsp.bind == "none"


def test_size_is_each_kind_s_to_read() -> None:
    (quick,) = build_suites(["noise"], SuiteOptions(size="quick"))
    (small,) = build_suites(["noise"], SuiteOptions(size="0.05"))
    assert isinstance(quick, NoiseSuite) and quick.quanta == 5000
    assert isinstance(small, NoiseSuite) and small.quanta == 20000


def test_a_run_s_identity_leaves_calibrated_values_out() -> None:
    def config(values: dict[str, int]) -> BenchConfig:
        return BenchConfig(envs=("native",), suites=("noise",), suite_options={"values": values})

    chosen = {"noise_quanta": 100}
    assert config(chosen).identity() == config(chosen | {"noise_iterations": 7}).identity()
    assert config(chosen).identity() != config({"noise_quanta": 101}).identity()


def test_settle_reads_paths_from_where_the_user_was(tmp_path: Path) -> None:
    values = settled(
        ["npb", "cmd"], {"npb_dir": "bin", "npb_kernels": "cg,ep", "cmd": "x"}, tmp_path
    )
    assert values["npb_dir"] == str(tmp_path / "bin")
    assert values["npb_kernels"] == ["cg", "ep"]
    assert values["cmd_cwd"] == str(tmp_path)
    assert settled(["noise"], {"npb_dir": "bin"}, tmp_path) == {"npb_dir": "bin"}


def test_guest_dirs_come_from_the_chosen_kinds_only(tmp_path: Path) -> None:
    options = SuiteOptions(values={"npb_dir": str(tmp_path), "cmd": "/opt/tool/run -x"})
    assert guest_dirs(["npb", "cmd"], options) == [tmp_path, Path("/opt/tool")]
    assert guest_dirs(["noise"], options) == []


def test_two_kinds_cannot_own_one_flag() -> None:
    def build(options: SuiteOptions) -> list[Suite]:
        return []

    taken = SuiteFlag("--noise-quanta", "mine")
    with pytest.raises(ValueError, match=r"--noise-quanta \(mine\) is suite noise's"):
        register(SuiteKind("thief", build, "steals a flag", flags=(taken,)))
    same_key = SuiteFlag("--mine", "noise_quanta")
    with pytest.raises(ValueError, match="is suite noise's"):
        register(SuiteKind("thief", build, "steals a key", flags=(same_key,)))
    assert "thief" not in REGISTRY
