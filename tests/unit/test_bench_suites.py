"""Suite registry and the mpirun launcher's argv (what it runs is tested natively in
tests/integration/test_bench_native.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.bench.core.launch import in_workdir, mpirun_argv
from hpcvm.bench.core.suite import Suite
from hpcvm.bench.suites.cmd.suite import CmdSuite
from hpcvm.bench.suites.hpcc.suite import HpccSuite
from hpcvm.bench.suites.noise.suite import NoiseSuite
from hpcvm.bench.suites.npb.suite import NpbSuite
from hpcvm.bench.suites.registry import SuiteOptions, build_suites, suite_names
from hpcvm.errors import UsageError


def test_registry_names() -> None:
    assert set(suite_names()) == {
        "hpcc",
        "noise",
        "npb",
        "netpipe",
        "cmd",
        "openfoam",
        "lammps",
        "bsp",
    }


def test_build_hpcc_and_noise_in_order_without_duplicates() -> None:
    suites = build_suites(["noise", "hpcc", "noise"], SuiteOptions())
    assert [s.name for s in suites] == ["noise", "hpcc"]
    assert isinstance(suites[0], NoiseSuite) and isinstance(suites[1], HpccSuite)
    assert suites[1].uses_np and not suites[0].uses_np


def test_every_suite_class_implements_the_protocol(tmp_path: Path) -> None:
    instances = [
        HpccSuite(),
        NoiseSuite(),
        NpbSuite("cg", "A", {"x": tmp_path / "cg.A.x"}),
        CmdSuite("/bin/true", "(x)", higher_is_better=True),
    ]
    for suite in instances:
        assert isinstance(suite, Suite)
        assert suite.metrics and all(m.unit or m.name == "value" for m in suite.metrics)


def test_unknown_suite_names_the_known_ones() -> None:
    with pytest.raises(UsageError, match="unknown suite 'linpack': choose from hpcc, noise"):
        build_suites(["hpcc", "linpack"], SuiteOptions())


def test_npb_needs_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--npb-dir"):
        build_suites(["npb"], SuiteOptions())
    with pytest.raises(UsageError, match="does not exist"):
        build_suites(["npb"], SuiteOptions(npb_dir=tmp_path / "missing"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (SuiteOptions(), "--cmd"),
        (SuiteOptions(cmd="/bin/true"), "--metric"),
        (SuiteOptions(cmd="/bin/true", metric="(x)"), "lower-is-better"),
        (SuiteOptions(cmd="/bin/true", metric="(x", higher_is_better=True), "bad --metric"),
    ],
)
def test_cmd_needs_command_regex_and_direction(options: SuiteOptions, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        build_suites(["cmd"], options)


def test_cmd_suite_from_options(tmp_path: Path) -> None:
    options = SuiteOptions(
        cmd="/bin/echo 3", metric="([0-9]+)", higher_is_better=False, unit="s", cmd_cwd=tmp_path
    )
    (suite,) = build_suites(["cmd"], options)
    assert isinstance(suite, CmdSuite) and suite.cwd == tmp_path
    assert suite.metrics[0].unit == "s" and not suite.metrics[0].higher_is_better


def test_hpcc_size_from_options() -> None:
    (suite,) = build_suites(["hpcc"], SuiteOptions(hpcc_size=0.5))
    assert isinstance(suite, HpccSuite) and suite.size == 0.5
    with pytest.raises(UsageError):
        build_suites(["hpcc"], SuiteOptions(hpcc_size=0.99))


# --- launcher ---------------------------------------------------------------------------


def option_value(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def test_mpirun_argv_default_binds_one_rank_per_core() -> None:
    argv = mpirun_argv(4, ["/usr/bin/hpcc"])
    assert Path(argv[0]).is_absolute() and "mpirun" in Path(argv[0]).name
    assert "--allow-run-as-root" in argv
    assert option_value(argv, "-np") == "4"
    assert option_value(argv, "--map-by") == "core"
    assert option_value(argv, "--bind-to") == "core"
    assert "--oversubscribe" not in argv
    mca = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
    assert mca == {"plm": "isolated", "pml": "ob1", "btl": "self,vader"}
    assert argv[-1] == "/usr/bin/hpcc"


def test_mpirun_argv_hwthread_and_none() -> None:
    hw = mpirun_argv(2, ["x"], bind="hwthread")
    assert "--use-hwthread-cpus" in hw and option_value(hw, "--bind-to") == "hwthread"
    assert option_value(mpirun_argv(2, ["x"], bind="none"), "--bind-to") == "none"


@pytest.mark.parametrize(("np", "argv", "bind"), [(0, ["x"], "core"), (1, [], "core")])
def test_mpirun_argv_refuses_nonsense(np: int, argv: list[str], bind: str) -> None:
    with pytest.raises(UsageError):
        mpirun_argv(np, argv, bind=bind)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="unknown binding"):
        mpirun_argv(1, ["x"], bind="socket")  # type: ignore[arg-type]


def test_in_workdir_needs_an_absolute_directory() -> None:
    assert in_workdir(Path("/tmp/w"), ["a", "b"]) == ["/usr/bin/env", "-C", "/tmp/w", "a", "b"]
    with pytest.raises(UsageError):
        in_workdir(Path("relative"), ["a"])


def test_labels_come_from_each_suite_kind() -> None:
    """Figures and tables say what they show: the studies' short names for hpcc and
    noise, "CG time, np 1" for NPB, the metric itself for an unknown suite."""
    from hpcvm.report.labels import label

    assert label("hpcc", "MPIRandomAccess_GUPs", 4) == "RA MPI 4"
    assert label("noise", "NoiseP999Detour_usec", None) == "Noise p99.9"
    assert label("npb:cg.S", "Time_sec", 1) == "CG time, np 1"
    assert label("npb:is.W", "Mops_total", 2) == "IS Mop/s, np 2"
    assert label("mine", "value", 2) == "value 2"
