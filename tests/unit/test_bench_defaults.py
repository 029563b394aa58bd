"""`hpcvm bench` with no --env/--suite runs the README's default comparison."""

from __future__ import annotations

from click.testing import CliRunner

from hpcvm.cli.bench_cmd import bench_cmd


def test_help_names_the_defaults() -> None:
    # as one line of words: where click wraps depends on the registry's suite names
    out = " ".join(CliRunner().invoke(bench_cmd, ["--help"]).output.split())
    assert "native vm:naive vm:hpc" in out
    assert "hpcc noise" in out
    assert "[default: results]" in out
