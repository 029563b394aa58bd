"""A setting for a suite or for the VMs that the run does not select is refused in one
line before anything starts, never silently ignored: `--noise-quanta 500` on a run
without the noise suite would otherwise leave the user believing it had been used."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.cli.main import main


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--suite", "hpcc", "--noise-quanta", "500"), "--noise-quanta"),
        (("--suite", "hpcc", "--noise-quantum-us", "20"), "--noise-quantum-us"),
        (("--suite", "noise", "--bsp-grain-us", "50"), "--bsp-grain-us"),
        (("--bsp-steps", "10"), "--bsp-steps"),  # the default suites lack bsp
        (("--suite", "noise", "--vm-memory", "512M"), "--vm-memory"),
        (("--suite", "noise", "--vm-vcpus", "1"), "--vm-vcpus"),
        (("--suite", "noise", "--vm-guest-nodes", "1"), "--vm-guest-nodes"),
        (("--suite", "noise", "--vm-backend", "libvirt"), "--vm-backend"),
    ],
)
def test_an_unselected_setting_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], flag: str
) -> None:
    out = tmp_path / "never"
    code = main(["bench", "--env", "native", *args, "--out", str(out)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and flag in lines[0] and "drop " + flag in lines[0], err
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ("--noise-quanta", "500"),  # the default suites include noise
        ("--suite", "bsp", "--bsp-steps", "10", "--bsp-grain-us", "50"),
        ("--env", "vm:hpc", "--suite", "noise", "--vm-memory", "512M"),
    ],
)
def test_a_selected_setting_passes_the_option_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    """Accepted settings get past the checks: the run is stopped at --dry-run-like
    refusal of a bad --reps instead, which comes after them."""
    code = main(["bench", "--env", "native", *args, "--reps", "0", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "--reps" in err and "does not select" not in err, err
    assert "no vm:*" not in err, err
