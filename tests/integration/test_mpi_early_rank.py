"""A rank that fails before MPI_Init ends its sample at once, with the rank's own error.

Real Open MPI 4.1 (mpirun as bench runs it: launch.mpirun_argv, natively through
NativeEnvironment.run) and a real MPI program (hpcvm's bsp helper). One rank of two is a
shell that fails before MPI_Init in one of the two ways measured to hang mpirun
(bench/envs/mpiwatch.py); the other runs the MPI program and waits in MPI_Init. Without the
watch, each run waits out its timeout (TIMEOUT here, 3600 s in bench). The oracle is the
clock and the run's own stderr. A control run, whose rank 0 works on after MPI_Finalize
while the other rank has ended, must not be cut short.
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
from pathlib import Path

import pytest

from hpcvm.bench.core.launch import mpirun_argv
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.suites.bsp.suite import bsp_binary
from hpcvm.errors import BenchmarkError

TIMEOUT = 120.0  # what each run would wait without the watch
PROMPT = 30.0  # GRACE (5 s) plus mpirun's start on a loaded 2-core machine
# a user that exists everywhere: PMIx refuses a rank of another uid in MPI_Init, but a
# uid with no passwd entry makes its client crash there instead (no hang to watch)
TEST_UID = pwd.getpwnam("nobody").pw_uid
ARGS = '-s 200 -i 20 -o "$PWD/raw"'


def _bsp() -> Path:
    try:
        return bsp_binary()
    except BenchmarkError as exc:
        pytest.skip(str(exc))


def _rank_script(tmp_path: Path, rank1: str, after: str = "") -> Path:
    """A rank program: rank 1 does ``rank1`` (bash), every other rank runs bsp and
    then ``after`` (a builtin loop spins without forking, so the CPU is the rank's)."""
    script = tmp_path / "rank.sh"
    script.write_text(
        "#!/bin/bash\n"
        f'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then {rank1}; fi\n'
        f"{_bsp()} {ARGS} || exit $?\n"
        f"{after}\n"
    )
    script.chmod(0o755)
    return script


def _run(tmp_path: Path, script: Path) -> tuple[int, str, float, bool]:
    env = NativeEnvironment()
    begin = time.monotonic()
    out = env.run(mpirun_argv(2, [str(script)], bind="none"), tmp_path / "work", TIMEOUT)
    return out.exit_code, out.stderr, time.monotonic() - begin, out.timed_out


def _left(tmp_path: Path, settle: float = 10.0) -> list[str]:
    """Processes still running this test's ranks (their argv names its directory), with
    their command lines. A rank that was sent its signal as the run ended may still be
    in its exit for a moment on a loaded host: looked at again for up to ``settle``
    seconds, so only one that stays is reported."""
    deadline = time.monotonic() + settle
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if entry.name.isdigit() and str(tmp_path).encode() in cmdline and state != "Z":
                argv = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name}: {argv[:160]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def _two_cpus() -> None:
    if len(os.sched_getaffinity(0)) < 2 or shutil.which("mpirun.openmpi") is None:
        pytest.skip("needs Open MPI and two CPUs")


def test_a_rank_that_exits_before_mpi_init_ends_the_run(tmp_path: Path) -> None:
    script = _rank_script(tmp_path, "echo 'rank1: cannot open input deck' >&2; exit 0")
    code, stderr, seconds, timed_out = _run(tmp_path, script)
    assert not timed_out and seconds < PROMPT, (seconds, stderr)
    assert code != 0
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("hpcvm: 1 of 2 rank(s) ended") and "MPI_Init" in last, last
    assert "rank1: cannot open input deck" in last  # the rank's own error, in the record
    assert _left(tmp_path) == []  # rank 0, in MPI_Init in a process group of its own


def test_a_rank_pmix_refuses_in_mpi_init_ends_the_run(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a rank under another uid")
    # PMIx's native security refuses a client of another uid in MPI_Init (as it refused
    # a rootless container's rank); mpirun then hangs and ignores SIGTERM.
    setpriv = shutil.which("setpriv")
    assert setpriv is not None
    refuse = f"exec {setpriv} --reuid={TEST_UID} --regid={TEST_UID} --clear-groups {_bsp()} {ARGS}"
    code, stderr, seconds, timed_out = _run(tmp_path, _rank_script(tmp_path, refuse))
    assert not timed_out and seconds < PROMPT, (seconds, stderr)
    assert code != 0
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("hpcvm: ") and "MPI_Init" in last, last
    assert _left(tmp_path) == []


def test_a_rank_working_after_the_others_ended_is_not_cut_short(tmp_path: Path) -> None:
    # rank 0 spins 8 s of CPU or more after MPI_Finalize while rank 1 has ended: work, not
    # a hang (bash's SECONDS counts whole seconds, so SECONDS + 9 spins between 8 and 9 s)
    spin = (
        'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then end=$((SECONDS + 9)); '
        "while ((SECONDS < end)); do :; done; echo rank0-done; fi"
    )
    script = _rank_script(tmp_path, f"{_bsp()} {ARGS}; exit $?", after=spin)
    code, stderr, seconds, timed_out = _run(tmp_path, script)
    assert (code, timed_out) == (0, False), stderr
    assert seconds >= 8 and "hpcvm:" not in stderr
