"""`hpcvm bench` with no --env/--suite runs the README's default comparison."""

from __future__ import annotations

from click.testing import CliRunner

from hpcvm.cli.bench_cmd import DEFAULT_ENVS, DEFAULT_SUITES, bench_cmd


def test_help_names_the_defaults() -> None:
    out = CliRunner().invoke(bench_cmd, ["--help"]).output
    assert "native vm:naive vm:hpc" in out
    assert "hpcc noise" in out
    assert "[default: results]" in out


def test_defaults_are_the_studies_two_ends_against_native() -> None:
    assert DEFAULT_ENVS[0] == "native"
    assert {"vm:naive", "vm:hpc"} <= set(DEFAULT_ENVS)
    assert set(DEFAULT_SUITES) == {"hpcc", "noise"}
