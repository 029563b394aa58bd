"""Periodic checkpoints (cluster/commands/keeper.py) without a batch system: the series of a
job's checkpoints on disk (checkpoint_series.py: which is restored, what is pruned),
its history, the intervals that minimise lost work (checked against scipy's
minimisation of the models they come from), the lock that makes other writers wait for
a periodic checkpoint, and the refusals of ``cluster up --checkpoint-every`` and
``cluster checkpoint --series`` before anything starts. The keeper itself runs in the
Slurm story of tests/integration/test_cluster_checkpoint.py (a node's VM killed, the
job restored from its last periodic checkpoint)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scipy.optimize import minimize_scalar

from hpcvm.cli.common import parse_duration
from hpcvm.cluster.batch.slurm import parse_draining
from hpcvm.cluster.commands import keeper
from hpcvm.cluster.commands.keeper import Taken
from hpcvm.cluster.job import checkpoint_series
from hpcvm.errors import BusyError, UsageError
from hpcvm.lock import exclusive
from tests.unit.test_cluster_checkpoint import _cli, _one_error, write_checkpoint


def _series(tmp_path: Path, complete: list[int], partial: tuple[int, ...] = ()) -> Path:
    series = tmp_path / "series"
    series.mkdir(mode=0o700)
    for seq in complete:
        write_checkpoint(series / f"checkpoint-{seq:06d}")
    for seq in partial:
        (series / f"checkpoint-{seq:06d}").mkdir()  # never committed: no manifest
    return series


def test_the_newest_complete_checkpoint_is_restored(tmp_path: Path) -> None:
    series = _series(tmp_path, [1, 2, 10], partial=(11,))
    assert checkpoint_series.is_series(series)
    assert checkpoint_series.newest_restorable(series).name == "checkpoint-000010"
    assert checkpoint_series.next_member(series).name == "checkpoint-000012"


def test_a_damaged_newest_checkpoint_is_passed_over_saying_why(tmp_path: Path) -> None:
    series = _series(tmp_path, [1, 2])
    (series / "checkpoint-000002" / "id_job").write_bytes(b"another key\n")
    said: list[str] = []
    assert checkpoint_series.newest_restorable(series, said.append).name == "checkpoint-000001"
    assert len(said) == 1 and "checkpoint-000002" in said[0], said


def test_a_series_with_nothing_complete_is_refused(tmp_path: Path) -> None:
    series = _series(tmp_path, [], partial=(1,))
    with pytest.raises(UsageError, match="holds no complete job checkpoint"):
        checkpoint_series.newest_restorable(series)


def test_prune_keeps_the_newest_and_anything_newer_than_it(tmp_path: Path) -> None:
    series = _series(tmp_path, [1, 3, 4], partial=(2, 5))
    gone = checkpoint_series.prune(series, keep=2)
    assert sorted(p.name for p in gone) == ["checkpoint-000001", "checkpoint-000002"]
    left = sorted(p.name for p in series.iterdir())
    # 5 may be a checkpoint being written now: never touched
    assert left == ["checkpoint-000003", "checkpoint-000004", "checkpoint-000005"]
    assert checkpoint_series.prune(series, keep=1) == [series / "checkpoint-000003"]


def test_a_single_checkpoint_is_no_series_and_cannot_be_one(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ck")
    assert not checkpoint_series.is_series(tmp_path / "ck")
    with pytest.raises(UsageError, match="is a job checkpoint itself"):
        checkpoint_series.prepare(tmp_path / "ck")


def test_prepare_checks_without_making_then_makes_it_private(tmp_path: Path) -> None:
    target = tmp_path / "series"
    assert checkpoint_series.prepare(target, make=False) == target and not target.exists()
    assert checkpoint_series.prepare(target) == target
    assert target.stat().st_mode & 0o777 == 0o700
    with pytest.raises(UsageError, match="is not a directory"):
        checkpoint_series.prepare(tmp_path / "nowhere" / "series", make=False)


def test_the_history_reads_back_and_skips_a_line_cut_short(tmp_path: Path) -> None:
    series = _series(tmp_path, [])
    ok = Taken(seq=1, at=time.time(), ok=True, seconds=3.5, paused_seconds=2.25,
               bytes=3 << 20, path=str(series / "checkpoint-000001"))  # fmt: skip
    failed = Taken(seq=2, at=time.time(), ok=False, seconds=0.5, error="no space left on device")
    keeper._record(series, ok)
    keeper._record(series, failed)
    with (series / keeper.HISTORY).open("a") as fh:
        fh.write('{"seq": 3, "at": 1')  # a keeper killed while it wrote
    assert keeper.history(series) == [ok, failed]
    assert "3.0 MiB" in keeper.describe("j", ok) and "stood still 2.25 s" in keeper.describe(
        "j", ok
    )
    assert "FAILED" in keeper.describe("j", failed)
    assert "no space left on device" in keeper.describe("j", failed)


@pytest.mark.parametrize(("cost", "mtbf"), [(2.0, 3600.0), (30.0, 86400.0), (120.0, 7200.0)])
def test_young_interval_minimises_the_lost_fraction(cost: float, mtbf: float) -> None:
    found = minimize_scalar(
        lambda t: keeper.lost_fraction(t, cost, mtbf), bounds=(cost, mtbf), method="bounded"
    )
    assert keeper.young_interval(cost, mtbf) == pytest.approx(found.x, rel=1e-3)


@pytest.mark.parametrize(("cost", "mtbf"), [(2.0, 3600.0), (30.0, 86400.0), (120.0, 7200.0)])
def test_daly_interval_is_near_the_optimum_of_his_exponential_model(
    cost: float, mtbf: float
) -> None:
    """Daly (2006): expected wall time of T_s of work at interval t with failures at
    rate 1/M, checkpoint cost C (restart cost R as a constant factor):
    M e^(R/M) (e^((t+C)/M) - 1) T_s / t. His formula approximates its minimum."""

    def wall(t: float) -> float:
        return mtbf * (math.exp((t + cost) / mtbf) - 1.0) / t

    found = minimize_scalar(wall, bounds=(cost / 10, 5 * mtbf), method="bounded")
    daly = keeper.daly_interval(cost, mtbf)
    assert daly == pytest.approx(found.x, rel=0.01)
    assert wall(daly) == pytest.approx(wall(found.x), rel=1e-4)


def test_daly_interval_is_the_mtbf_when_a_checkpoint_costs_more_than_two() -> None:
    assert keeper.daly_interval(cost=500.0, mtbf=200.0) == 200.0


HOLD = """
import sys, time
from pathlib import Path
from hpcvm.lock import exclusive
with exclusive(Path(sys.argv[1]), "thing", "wait", label=sys.argv[2]):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _holding(lock: Path, label: str, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), label, str(seconds)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_writer_waits_for_a_holder_it_may_outwait_and_refuses_others(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    proc = _holding(lock, "periodic save", 1.5)
    began = time.monotonic()
    with exclusive(lock, "thing", "wait", outwait=lambda h: h.command == "periodic save",
                   patience=60):  # fmt: skip
        waited = time.monotonic() - began
    proc.wait(timeout=30)
    assert waited > 0.5, waited  # it did wait for the holder, which then ended
    proc = _holding(lock, "an up", 30)
    try:
        with (
            pytest.raises(BusyError, match="an up"),
            exclusive(
                lock, "thing", "wait", outwait=lambda h: h.command == "periodic save", patience=60
            ),  # fmt: skip
        ):
            pass
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_up_refuses_bad_periodic_options_before_anything_starts(tmp_path: Path) -> None:
    rt, series = tmp_path / "rt", tmp_path / "series"
    base = ["up", "--name", "c", "--batch", "local", "--image", "/nonexistent.qcow2"]
    cases = [
        (["--checkpoint-every", "30m"], "needs --checkpoint-dir"),
        (["--checkpoint-dir", str(series)], "--checkpoint-dir is for --checkpoint-every"),
        (["--checkpoint-every", "soon", "--checkpoint-dir", str(series)], "malformed"),
        (["--checkpoint-every", "0.5", "--checkpoint-dir", str(series)], "at least 1 s"),
        (["--checkpoint-every", "1h", "--checkpoint-dir", str(tmp_path / "no" / "s")],
         "is not a directory"),
    ]  # fmt: skip
    for extra, expected in cases:
        line = _one_error(_cli(*base, *extra, runtime=rt))
        assert expected in line, (extra, line)
    write_checkpoint(tmp_path / "ck")
    line = _one_error(_cli(*base, "--checkpoint-every", "1h", "--checkpoint-dir",
                           str(tmp_path / "ck"), runtime=rt))  # fmt: skip
    assert "is a job checkpoint itself" in line
    assert not series.exists()
    assert not rt.exists() or not any(rt.rglob("*.json"))


def test_restore_from_a_series_names_the_checkpoint_it_chose(tmp_path: Path) -> None:
    series = _series(tmp_path, [1, 2])
    done = _cli("up", "--name", "c", "--batch", "local", "--nodes", "1", "--restore",
                str(series), runtime=tmp_path / "rt")  # fmt: skip
    assert "the newest complete checkpoint of" in done.stderr, done.stderr
    assert "is checkpoint-000002" in done.stderr, done.stderr
    assert "holds 2 VMs and this allocation has 1 node(s)" in _one_error(done)


def test_a_series_checkpoint_of_an_unknown_cluster_leaves_nothing(tmp_path: Path) -> None:
    done = _cli("checkpoint", "ghost", str(tmp_path / "s"), "--series", runtime=tmp_path / "rt")
    assert "no cluster named 'ghost'" in _one_error(done)
    assert not (tmp_path / "s").exists()
    assert (
        os.listdir(tmp_path) == ["rt"]
        or not os.listdir(tmp_path)
        or (set(os.listdir(tmp_path)) <= {"rt"})
    )


SLURM_DATA = Path(__file__).parent / "data" / "slurm"


def test_draining_nodes_are_read_from_scontrols_own_output() -> None:
    """``scontrol show node --oneliner node3,node4`` of Slurm 22.05, captured on the
    test cluster after ``scontrol update NodeName=node4 State=DRAIN Reason=...``: node4
    drains with its reason (spaces, a comma and Slurm's stamp kept), node3 does not."""
    text = (SLURM_DATA / "scontrol-show-node-drained.txt").read_text()
    assert parse_draining(text) == {
        "node4": "disk check failed, replace sda [root@2026-11-28T04:42:42]"
    }
    assert parse_draining(text.replace("State=IDLE+DRAIN", "State=MIXED")) == {}
    assert parse_draining(text.replace("State=IDLE+DRAIN", "State=DRAINING")) == {
        "node4": "disk check failed, replace sda [root@2026-11-28T04:42:42]"
    }


@pytest.mark.parametrize(
    ("seconds", "text"), [(7200, "2h"), (1800, "30m"), (90, "90s"), (10, "10s"), (1.5, "1.5s")]
)
def test_an_interval_is_said_as_the_option_takes_it(seconds: float, text: str) -> None:
    assert keeper.interval_text(seconds) == text
    assert parse_duration(text, "--checkpoint-every") == seconds


def test_a_series_the_user_cannot_reach_is_refused_in_one_line() -> None:
    """Under a directory the user may not enter (as nobody: root's /root is 0700)."""
    if os.geteuid() != 0 or os.stat("/root").st_mode & 0o005:
        pytest.skip("needs root to act as nobody, and a /root others may not enter")
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         "from pathlib import Path; from hpcvm.cluster.job import checkpoint_series as c; "
         "c.prepare(Path('/root/x'), make=False)"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert "UsageError" in done.stderr and "cannot be reached (Permission denied)" in done.stderr


def test_another_users_series_or_member_is_never_used(tmp_path: Path) -> None:
    """In a shared sticky directory another user could plant a newer 'checkpoint' to
    be restored: a series directory not the user's own is refused, and a member not
    the user's own is not one (nobody's here, made by root for the test)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make another user's directories")
    series = _series(tmp_path, [1])
    planted = series / "checkpoint-000009"
    write_checkpoint(planted)
    for path in [planted, *planted.rglob("*")]:
        os.chown(path, 65534, 65534)
    assert checkpoint_series.newest_restorable(series).name == "checkpoint-000001"
    assert checkpoint_series.next_member(series).name == "checkpoint-000002"
    assert checkpoint_series.prune(series, keep=1) == [] and planted.exists()
    os.chown(series, 65534, 65534)
    with pytest.raises(UsageError, match="is another user's"):
        checkpoint_series.prepare(series)


def test_a_history_or_log_that_cannot_be_written_does_not_end_the_keeper(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full file system under the series refuses the history's line and the log's:
    the keeper says what it could and goes on (it once died of the OSError)."""
    (tmp_path / keeper.HISTORY).mkdir()  # open() for append fails, as ENOSPC would
    taken = keeper.Taken(seq=3, at=0.0, ok=False, seconds=1.0, error="no space")
    keeper._record(tmp_path, taken)
    assert "could not add checkpoint 3" in capsys.readouterr().out
    full = open("/dev/full", "w")  # noqa: SIM115 - every write: ENOSPC, the kernel's own
    monkeypatch.setattr(sys, "stdout", full)
    keeper._say("a line the log cannot take")
    monkeypatch.undo()
    with pytest.raises(OSError):  # the line is still in its buffer: it was not written
        full.close()
