"""Run from /tmp, the built-in guest does not get the host's /tmp (issue 23, item 2).

The README's "what a guest sees" keeps the host's /tmp, /var, /home, /root and /srv out
of the guest; the working directory is shared only when it is a job's directory. One
guest is booted with /tmp as its working directory and asked, from inside, whether a
file the test put in the host's /tmp is there. Expected values come from the host's
files and the guest's own answers, never from hpcvm's share list alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime_support import HPCVM, Residue, assert_nothing_left

pytestmark = pytest.mark.integration

UP = ["--profile", "naive", "--vcpus", "1", "--memory", "256M", "--accel", "tcg"]
TIMEOUT = 600.0


@pytest.fixture(scope="module")
def booted(guest: None) -> Iterator[tuple[subprocess.CompletedProcess[str], Path, dict[str, str]]]:
    """One guest started from /tmp (a runtime directory outside it: /run), with a
    marker file in the host's /tmp; stopped, and nothing left, afterwards."""
    runtime = Path("/run") / f"hpcvm-test-workdir-{uuid.uuid4().hex[:8]}"
    marker = Path("/tmp") / f"hpcvm-workdir-marker-{uuid.uuid4().hex}"
    marker.write_text("host /tmp\n")
    env = {**os.environ, "HPCVM_RUNTIME_DIR": str(runtime), "HPCVM_READY_TIMEOUT": "300"}
    before = Residue.take(runtime)
    up = subprocess.run(
        [HPCVM, "up", "--name", "wd", *UP],
        cwd="/tmp", env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    try:
        yield up, marker, env
    finally:
        subprocess.run([HPCVM, "down", "--all", "--timeout", "10"], env=env, capture_output=True)
        marker.unlink(missing_ok=True)
        try:
            assert_nothing_left(before)
        finally:
            shutil.rmtree(runtime, ignore_errors=True)


def _in_guest(env: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCVM, "exec", "wd", "--", "/bin/sh", "-c", script],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip


def test_up_from_tmp_says_tmp_is_not_shared(
    booted: tuple[subprocess.CompletedProcess[str], Path, dict[str, str]],
) -> None:
    up, _marker, _env = booted
    assert up.returncode == 0, up.stderr
    assert "the working directory /tmp is not shared" in up.stderr
    assert "world-writable" in up.stderr and "--share /tmp" in up.stderr
    seen = next(ln for ln in up.stdout.splitlines() if "guest sees" in ln)
    shares = [item.split(" (")[0] for item in seen.split(" guest sees ", 1)[1].split("; ")]
    assert "/tmp" not in shares, seen  # (hpcvm's own data may live under /tmp: a clone)


def test_the_guest_does_not_see_the_hosts_tmp(
    booted: tuple[subprocess.CompletedProcess[str], Path, dict[str, str]],
) -> None:
    up, marker, env = booted
    assert up.returncode == 0, up.stderr
    assert marker.is_file()  # there on the host...
    listed = _in_guest(env, "ls -A /tmp")
    assert listed.returncode == 0, listed.stderr
    assert marker.name not in listed.stdout.split()  # ...not in the guest
    # the guest's /tmp is its own: a file written there never reaches the host
    name = f"hpcvm-from-guest-{uuid.uuid4().hex}"
    wrote = _in_guest(env, f"echo x > /tmp/{name} && cat /tmp/{name}")
    assert wrote.stdout == "x\n", wrote.stderr
    assert not (Path("/tmp") / name).exists()
    verified = subprocess.run(
        [HPCVM, "verify", "wd"], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
