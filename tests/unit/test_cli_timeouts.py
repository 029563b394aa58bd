"""Every timeout a user types is a finite number of seconds above zero, refused in one
line before anything starts: `up --ready-timeout -1` used to start QEMU with a deadline
already past. Each case also carries a second mistake that the old code reported
instead (a missing kernel, an unknown VM), so no test here can boot a guest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

UP = ["--profile", "naive", "--vcpus", "1", "--memory", "256M", "--kernel", "/nonexistent"]
CASES = {
    "up --ready-timeout": ["up", "--name", "t", *UP, "--ready-timeout"],
    "run --ready-timeout": ["run", *UP, "--ready-timeout", "{}", "--", "true"],
    "run --timeout": ["run", *UP, "--timeout", "{}", "--", "true"],
    "exec --timeout": ["exec", "no-such-vm", "--timeout", "{}", "--", "true"],
    "down --timeout": ["down", "no-such-vm", "--timeout"],
    "cluster up --timeout": ["cluster", "up", "--name", "c", *UP, "--timeout"],
    "cluster exec --timeout": ["cluster", "exec", "no-such", "--timeout", "{}", "--", "true"],
}


def hpcvm(args: list[str], runtime: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCVM_RUNTIME_DIR": str(runtime)}
    env.pop("SLURM_JOB_ID", None)
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_timeouts_are_one_line_usage_errors(tmp_path: Path, case: str, value: str) -> None:
    template = CASES[case]
    args = [a.replace("{}", value) for a in template] if "{}" in template else [*template, value]
    done = hpcvm(args, tmp_path / "rt")
    option = case.split()[-1]
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [f"hpcvm: error: {option} {value!r} is not a positive number of seconds: "
                     f"give e.g. {option} 90"]  # fmt: skip
    assert not (tmp_path / "rt").exists()


@pytest.mark.parametrize("bad", ["-5", "0", "nan", "inf", "x"])
def test_ready_timeout_from_the_environment_is_checked_too(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    from hpcvm.errors import UsageError
    from hpcvm.runtime.machine.timeouts import ENV_READY_TIMEOUT
    from hpcvm.runtime.vm.readiness import env_ready_timeout

    monkeypatch.setenv(ENV_READY_TIMEOUT, bad)
    with pytest.raises(UsageError, match=ENV_READY_TIMEOUT):
        env_ready_timeout()
    monkeypatch.setenv(ENV_READY_TIMEOUT, "2.5")
    assert env_ready_timeout() == 2.5
    monkeypatch.delenv(ENV_READY_TIMEOUT)
    assert env_ready_timeout() is None
