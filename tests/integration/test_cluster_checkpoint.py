"""A whole MPI job checkpointed in its VMs at an interval and at a signal, requeued,
restored on two other nodes, where it loses a node's VM, requeued again and restored
from its last periodic checkpoint, where it goes on to the end:
docs/examples/hpcvm-checkpoint-job.sh, submitted by the unprivileged test user to the
Slurm test cluster (scripts/test-cluster.sh, cgroup plugins), as a site's user would.

The story (one job, module scope): the job boots one VM per node on node1 and node2 from
the test image (tests/image_builder.py: Open MPI, sshd and tests/cluster/mpi_ring.c in
it), with a checkpoint every few seconds (HPCVM_CHECKPOINT_EVERY) into a series on a
small tmpfs that every node sees (the test cluster's shared mount point, as a site's
shared file system), and starts the MPI ring detached. Boot once, restore many (issue
35): the first session on a machine keeps the story's first periodic checkpoint beside
the image's cached guests (tests/booted_guests.py), keyed by what the job was started
from (image, QEMU, checkpoint schemas, this script, the ring, the nodes and network);
a later session puts it into the series before the job starts, so the script's first
start restores it (its second branch, as after a requeue) instead of booting two guests
for minutes, and the ring goes on from there. A kept checkpoint hpcvm refuses is
forgotten and the job booted. The script's first branch (cluster up --image, the ring
detached) runs in the first session and whenever this key changes;
test_cluster_migrate boots disk-image guests in a job with the same commands in every
session. Once a periodic checkpoint is
complete, the test shrinks that file system to what it holds until a periodic checkpoint
has failed for want of space (the kernel's ENOSPC, midway through the save). Then it
drains node2 as the admin: the job's keeper, with no spare node, sends the batch script
SIGUSR1, as Slurm does before a time limit (``scancel --signal=USR1 --batch``), and the
script saves the job as the series' next checkpoint and requeues it. The requeued job is
moved to node3 and node4 (``scontrol update``, as the user may) and restores the saved
VMs there. Once it has taken a periodic checkpoint there, node4's link to the switch
goes down for 10 s, then for 60 s (the job must go on and save again after each), then
node4's task of the next periodic save is killed (that checkpoint fails, naming node4,
and the VMs run on), then the QEMU of its second VM is killed, as a node crash ends
it without warning: ``cluster wait`` ends (exit 11) naming the node, and the script
requeues the job, which restores the newest periodic checkpoint on node1 and node2 and
collects the ring's output with ``cluster wait``. Then damaged, incomplete and
mismatched copies of the signal's checkpoint are restored and must be refused before
any VM runs, and a job restoring an intact copy is cancelled while QEMU loads the
state: nothing may be left on any node, and the copy must be unchanged. Jobs restoring
further copies then move a VM to a spare node while the test kills one side of the
move at each phase.

Oracles independent of hpcvm: the MPI program's own output (every round once, in
order, and a counter that is right only when no message was lost or repeated: Open
MPI's TCP transport does not reconnect, so a broken connection would abort the job),
Slurm's record of the job (its restarts and nodes) and of its nodes (drained), the
kernel's cpuset of each node for where the restored vCPUs ran, and /proc for QEMU
processes left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hpcvm.cluster.job import checkpoint_model
from tests import booted_guests, cluster_support
from tests.cluster_support import LocalCluster, job_state, vm_count
from tests.sites import SlurmSite, wait_until

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster
user_hpcvm = cluster_support.user_hpcvm
image = cluster_support.image

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docs" / "examples" / "hpcvm-checkpoint-job.sh"
ROUNDS = 350  # 105 s of ring at least: it must outlast the first two runs (about 70 s),
# also from a kept checkpoint taken 5-10 s into the ring
DELAY_MS = 300
EVERY = "10s"  # the periodic checkpoints' interval
REASON = "hpcvm-test-drain"
NAME = "ck"
VMS = f"{NAME}-node"  # every VM of the job: NAME-<node>
FAILED = re.compile(rf"^hpcvm: cluster {NAME}: periodic checkpoint \d+ at \S+ FAILED .*$", re.M)
SAID = re.compile(rf"^hpcvm: cluster {NAME}: periodic checkpoint \d+ at \S+ saved in ", re.M)
FIRST = ("node1", "node2")
THEN = ("node3", "node4")
ROUND = re.compile(r"^round=(\d+) counter=(\d+) host=(\S+) peer=(\S+)$", re.M)
PS_ROW = re.compile(r"^│ (node\d) +│ (\S+) +│ (\w+) +│ (\S+) +│ (\S+) +│", re.M)
BOOT_TIMEOUT = 900.0  # two disk-image guests booting under TCG on a loaded 2-core machine
MEMORY = "384M"
# two disk-image guests booting at once under TCG: minutes on a slow day
UP_OPTIONS = "--accel tcg --housekeeping 0 --timeout 900 --ready-timeout 600"
JOB_SCHEMA = checkpoint_model.SCHEMA
SERIES_MIB = 4096  # the shared tmpfs of the series: a few checkpoints of two 384M guests
FREE_WHEN_FULL = 4 * 2**20  # room left on it while "full": the history's lines, no VM
LINK_DOWN_SECONDS = 10.0
LONG_LINK_DOWN_SECONDS = 60.0  # under the test cluster's SlurmdTimeout (120 s)


@dataclass
class Story:
    cluster: LocalCluster
    job: str
    out: Path
    first_run: str  # the job's output when it was requeued at the signal
    second_run: str  # ... and when it was requeued after the lost VM
    text: str  # all of it, at the end
    saved: Path  # a copy of the signal's checkpoint, taken while the job waited
    history: list[dict[str, Any]]  # the series' checkpoints.jsonl at the second requeue
    workdir: Path
    series: Path  # the job's series of checkpoints, on the small shared tmpfs
    hpcvm: str
    started_at_signal: float  # seconds from the ring's start to the signal
    killed: str  # the node whose VM's QEMU the test killed
    signal_seq: int  # the number of the signal's checkpoint in the series
    held_at_failure: list[str]  # the series' files when a periodic checkpoint failed
    keeper_said: str  # the keeper's log when the job was requeued for the drain
    outage: Outage  # what the job's output said while node4's link was down, and after
    long_outage: Outage  # ... the same for the 60 s one
    killed_save: str  # the job's output after node4's save task was killed
    held_after_kill: list[str]  # the series' files then
    vm_killed_at: float  # when the test killed the second VM's QEMU (time.time())


def _job_cache(image: Path) -> Path:
    """Where this story's first checkpoint is kept for the next session: beside the
    image's cached guests (tests/booted_guests.py), keyed by what the saved job was
    started from: the image, QEMU, the checkpoint schemas, the script, the ring, the
    guests' size and the cluster's nodes and network."""
    script = hashlib.sha256(SCRIPT.read_bytes()).hexdigest()
    fields = [script, str(ROUNDS), str(DELAY_MS), MEMORY, UP_OPTIONS, *FIRST,
              cluster_support.NET_PREFIX, f"job schema {JOB_SCHEMA}"]  # fmt: skip
    key = booted_guests.cache_key(image, NAME, fields)
    return image.parent / booted_guests.CACHE_DIR / f"job-{key}"


def _seed(series: Path, cache: Path) -> bool:
    """The series made (the test user's, 0700) and, when the cache holds a complete
    job checkpoint, that checkpoint put in as its first member: the job's first start
    then restores the job booted in an earlier session instead of booting it."""
    series.mkdir(mode=0o700)
    os.chown(series, cluster_support.TEST_UID, -1)
    if not (cache / "job.json").is_file():
        return False
    member = series / "checkpoint-000001"
    subprocess.run(["cp", "-a", str(cache), str(member)], check=True)
    subprocess.run(["chown", "-R", str(cluster_support.TEST_UID), str(member)], check=True)
    return True


def _keep(member: Path, cache: Path) -> None:
    """A complete first checkpoint of a booted story kept for the next session (copied
    aside, then renamed whole: a session beside this one sees all of it or none)."""
    if cache.exists() or not (member / "job.json").is_file():
        return
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f".{cache.name}.{os.getpid()}.partial")
    subprocess.run(["cp", "-a", str(member), str(partial)], check=True)
    try:
        partial.rename(cache)
    except OSError:  # another session kept one first
        shutil.rmtree(partial, ignore_errors=True)


def _submit(cluster: LocalCluster, env: dict[str, str], work: Path, out: Path) -> str:
    argv = ["sbatch", "-N", "2", f"--nodelist={','.join(FIRST)}", f"--chdir={work}",
            f"--output={out}", "--parsable", str(SCRIPT),
            "/usr/local/bin/mpi_ring", str(ROUNDS), str(DELAY_MS)]  # fmt: skip
    done = cluster.run(argv, env=env, user=cluster_support.TEST_USER)
    return done.stdout.strip().split(";")[0]


def _gone(cluster: LocalCluster, job: str) -> None:
    cluster.run(["scancel", job], check=False)
    wait_until("the job to leave the queue", lambda: job_state(cluster, job)
               in ("GONE", "COMPLETED", "CANCELLED", "FAILED"), timeout=120)  # fmt: skip
    wait_until("the job's VMs to go", lambda: vm_count(VMS) == 0, timeout=120)


def _shown_ready(out: Path) -> bool:
    """Whether the script showed its VMs ready (``cluster ps`` after ``cluster up``, the
    ring detached or restored): the same line after a boot and after a restore."""
    return bool(_ready_rows(_text(out)))


def _started(cluster: LocalCluster, job: str, out: Path) -> bool:
    """Whether the job's first start showed its VMs ready (else it ended first)."""
    wait_until("the ring to start", lambda: _shown_ready(out)
               or job_state(cluster, job) not in ("PENDING", "RUNNING"),
               timeout=BOOT_TIMEOUT)  # fmt: skip
    return _shown_ready(out)


@pytest.fixture(scope="module")
def story(slurm_cluster: LocalCluster, user_hpcvm: Path, image: Path) -> Iterator[Story]:
    site = SlurmSite(slurm_cluster, str(user_hpcvm))
    cache = _job_cache(image)
    with (
        cluster_support.user_dir("hpcvm-ckpt-") as work,
        cluster_support.small_fs(slurm_cluster, SERIES_MIB) as shared,
    ):
        series = shared / "checkpoint"
        env = site.job_env(
            NAME,
            HPCVM_IMAGE=str(image),
            HPCVM_MEMORY=MEMORY,
            HPCVM_CHECKPOINT=str(series),
            HPCVM_CHECKPOINT_EVERY=EVERY,
            HPCVM_UP_OPTIONS=UP_OPTIONS,
        )
        out = work / "job.out"
        restored = _seed(series, cache)
        job = _submit(slurm_cluster, env, work, out)
        try:
            if restored and not _started(slurm_cluster, job, out):
                # hpcvm refused the kept checkpoint (a QEMU or hpcvm change the key does
                # not see): forget it and boot, as a first session does
                _gone(slurm_cluster, job)
                shutil.rmtree(cache, ignore_errors=True)
                shutil.rmtree(series)
                out.unlink(missing_ok=True)
                restored = _seed(series, cache)
                job = _submit(slurm_cluster, env, work, out)
            keep = None if restored else (lambda member: _keep(member, cache))
            yield _run_story(slurm_cluster, job, out, work, series, str(user_hpcvm), keep)
        finally:
            _gone(slurm_cluster, job)


def _text(out: Path) -> str:
    return out.read_text(errors="replace") if out.is_file() else ""


def _keeper_log(series: Path) -> str:
    log = series / "checkpoints.log"
    return "\n--- the keeper's log:\n" + (log.read_text() if log.is_file() else "(none)")


def _newest(series: Path) -> Path:
    done = sorted(series.glob("checkpoint-*/job.json"))
    assert done, list(series.iterdir())
    return done[-1].parent


def _kill_qemu(vm: str) -> None:
    """SIGKILL the QEMU of ``vm``, as a node that crashes ends it (found in /proc)."""
    found = cluster_support.pids_with([b"qemu-system", vm.encode()])
    if not found:
        pytest.fail(f"no QEMU of {vm} to kill")
    os.kill(found[0], 9)


def _run_story(
    cluster: LocalCluster,
    job: str,
    out: Path,
    work: Path,
    series: Path,
    hpcvm: str,
    keep: Callable[[Path], None] | None,
) -> Story:
    user = cluster_support.TEST_USER

    def periodic_said(since: int) -> Callable[[], bool]:
        """cluster wait said a saved periodic checkpoint in the output after ``since``
        (or the job has ended)."""
        return lambda: bool(SAID.search(_text(out)[since:])) or job_state(cluster, job) not in (
            "PENDING", "RUNNING", "REQUEUED", "CONFIGURING"
        )  # fmt: skip

    def move_to(nodes: tuple[str, ...]) -> None:
        cluster.run(["scontrol", "update", f"JobId={job}", f"ReqNodeList={','.join(nodes)}",
                     "StartTime=now"], user=user)  # fmt: skip

    assert _started(cluster, job, out), _text(out)
    started = time.monotonic()
    wait_until("a periodic checkpoint", periodic_said(0), timeout=600)
    failed = _a_save_fails(cluster, job, out, series, keep)
    signalled = time.monotonic() - started
    assert job_state(cluster, job) == "RUNNING", _text(out) + _keeper_log(series)
    # the admin drains node2: the keeper (no spare) sends the batch script SIGUSR1, as
    # Slurm does before a time limit (scancel --signal=USR1 --batch, the same call)
    cluster.run(["scontrol", "update", "NodeName=node2", "State=DRAIN", f"Reason={REASON}"])
    try:
        wait_until("the checkpoint and the requeue", lambda: job_state(cluster, job) == "PENDING",
                   timeout=600)  # fmt: skip
    finally:
        cluster.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], check=False)
    keeper_said = _keeper_log(series)
    first_run = _text(out)
    assert "requeueing job" in first_run, first_run
    saved, signal_member = work / "saved", _newest(series)
    subprocess.run(["cp", "-a", str(signal_member), str(saved)], check=True)
    move_to(THEN)
    wait_until("a periodic checkpoint of the restored job", periodic_said(len(first_run)),
               timeout=900)  # fmt: skip
    assert job_state(cluster, job) == "RUNNING", _text(out) + _keeper_log(series)
    outage = _a_link_drops(cluster, job, out, THEN[1], LINK_DOWN_SECONDS)
    assert job_state(cluster, job) == "RUNNING", _text(out) + _keeper_log(series)
    long_outage = _a_link_drops(cluster, job, out, THEN[1], LONG_LINK_DOWN_SECONDS)
    assert job_state(cluster, job) == "RUNNING", _text(out) + _keeper_log(series)
    killed_save = _a_save_is_killed(cluster, job, out, THEN[1])
    held_after_kill = sorted(p.name for p in series.iterdir())
    assert job_state(cluster, job) == "RUNNING", _text(out) + _keeper_log(series)
    vm_killed_at = time.time()
    _kill_qemu(f"{NAME}-node2")  # on THEN[1] now
    wait_until("the requeue after the lost VM", lambda: job_state(cluster, job) == "PENDING",
               timeout=300)  # fmt: skip
    second_run = _text(out)
    history_file = series / "checkpoints.jsonl"
    history = [json.loads(line) for line in history_file.read_text().splitlines()]
    move_to(FIRST)
    wait_until("the restored job to end", lambda: job_state(cluster, job) not in
               ("PENDING", "RUNNING", "COMPLETING", "REQUEUED"), timeout=900)  # fmt: skip
    return Story(cluster, job, out, first_run, second_run, _text(out), saved, history, work,
                 series, hpcvm, signalled, THEN[1], int(signal_member.name.split("-")[1]),
                 failed, keeper_said, outage, long_outage, killed_save,
                 held_after_kill, vm_killed_at)  # fmt: skip


def _a_save_fails(
    cluster: LocalCluster, job: str, out: Path, series: Path, keep: Callable[[Path], None] | None
) -> list[str]:
    """The series' file system shrunk to what it holds (a disk that fills) until cluster
    wait says a periodic checkpoint failed; what the series held then (its last
    complete checkpoint must stay, and nothing half written). Meanwhile nothing prunes
    that checkpoint, so ``keep`` may copy it."""
    with cluster_support.free_only(series.parent, FREE_WHEN_FULL):
        wait_until("a failed periodic checkpoint", lambda: bool(FAILED.search(_text(out)))
                   or job_state(cluster, job) != "RUNNING", timeout=300)  # fmt: skip
        held = sorted(p.name for p in series.iterdir())
        if keep is not None and "checkpoint-000001" in held:
            keep(series / "checkpoint-000001")
        return held


@dataclass
class Outage:
    seconds: float  # how long node4's link was down
    down_at: float  # when it went down and came back (time.time(), as the history's)
    up_at: float
    said_during: str  # what the job's output said meanwhile
    said_after: str  # ... from the link's return until a periodic checkpoint was saved


def _said_after(
    cluster: LocalCluster, job: str, out: Path, pattern: re.Pattern[str], since: int
) -> Callable[[], bool]:
    """Whether the job's output matched ``pattern`` after offset ``since`` (or the job
    no longer runs), for wait_until."""
    return lambda: bool(pattern.search(_text(out)[since:])) or job_state(cluster, job) != "RUNNING"


def _a_link_drops(cluster: LocalCluster, job: str, out: Path, node: str, down: float) -> Outage:
    """``node``'s link down for ``down`` seconds, then up. The ring runs across it
    (its output comes only at its end, from the guest); the job must go on: still
    running, and saving its next periodic checkpoint after the link is back."""
    since = len(_text(out))
    began, down_at = time.monotonic(), time.time()
    with cluster_support.link_down(node):
        time.sleep(down)
    seconds, up_at = time.monotonic() - began, time.time()
    back = len(_text(out))
    wait_until("a periodic checkpoint after the outage", _said_after(cluster, job, out, SAID, back),
               timeout=300)  # fmt: skip
    text = _text(out)
    return Outage(seconds, down_at, up_at, text[since:back], text[back:])


def _a_save_is_killed(cluster: LocalCluster, job: str, out: Path, node: str) -> str:
    """The next periodic checkpoint's save task on ``node`` SIGKILLed while it saves (its
    process found in /proc: the phase in its command line, the node in its
    environment); what the job's output said about it."""
    since = len(_text(out))
    found: list[int] = []

    def saving() -> bool:
        found[:] = _phase_tasks("save", node)
        return bool(found) or job_state(cluster, job) != "RUNNING"

    wait_until(f"a save on {node}", saving, timeout=120)
    assert found, _text(out)[since:]
    for pid in found:
        os.kill(pid, 9)
    wait_until("the killed save to be said", _said_after(cluster, job, out, FAILED, since),
               timeout=300)  # fmt: skip
    return _text(out)[since:]


def _phase_tasks(action: str, node: str) -> list[int]:
    """The pids of a checkpoint phase's tasks on ``node``."""
    return cluster_support.pids_with(
        [b"checkpoint-node", f'"action":"{action}"'.encode()],
        [f"SLURMD_NODENAME={node}\0".encode()],
    )


def test_the_mpi_job_went_on_across_the_checkpoint(story: Story) -> None:
    rounds = [(int(r), int(c), h, p) for r, c, h, p in ROUND.findall(story.text)]
    assert [r for r, *_ in rounds] == list(range(1, ROUNDS + 1)), story.text
    assert all(c == 2 * r for r, c, *_ in rounds), rounds
    assert {(h, p) for *_, h, p in rounds} == {(f"{NAME}-node1", f"{NAME}-node2")}
    assert f"done counter={2 * ROUNDS} expected={2 * ROUNDS}" in story.text
    assert "the program ended with exit status 0" in story.text
    assert job_state(story.cluster, story.job) == "COMPLETED"


def _ready_rows(text: str) -> list[tuple[str, ...]]:
    return [row for row in PS_ROW.findall(text) if row[2] == "ready"]


def test_it_was_saved_mid_run_on_two_nodes_and_restored_on_two_others(story: Story) -> None:
    manifest = json.loads((story.saved / "job.json").read_text())
    assert [(v["node"], v["vm"]) for v in manifest["vms"]] == [(n, f"{NAME}-{n}") for n in FIRST]
    # the ring had not ended when it was saved: its command waited in the first guest
    assert [d["argv"][-3:] for d in manifest["detached"]] == [
        ["/usr/local/bin/mpi_ring", str(ROUNDS), str(DELAY_MS)]
    ]
    assert story.started_at_signal < ROUNDS * DELAY_MS / 1000
    second = story.second_run[len(story.first_run) :]
    assert "restoring cluster ck" in second and "(restart 1)" in second, second
    rows = {(node, vm) for node, vm, *_ in _ready_rows(second)}
    assert rows == {(THEN[0], f"{NAME}-node1"), (THEN[1], f"{NAME}-node2")}, second
    # the saved guests keep their addresses, on every restore
    saved_addresses = sorted(v["address"] for v in manifest["vms"])
    third = story.text[len(story.second_run) :]
    for segment in (second, third):
        assert sorted({row[3] for row in _ready_rows(segment)}) == saved_addresses, segment


def test_periodic_checkpoints_were_taken_and_said_while_the_ring_ran(story: Story) -> None:
    """Both runs before the end saved the job at the interval; each saved one is
    complete in the history with what it cost, and cluster wait said it in the job's
    output as it happened."""
    saved = [t for t in story.history if t["ok"]]
    assert len(saved) >= 2, story.history
    for taken in saved:
        assert taken["paused_seconds"] > 0 and taken["bytes"] > 0, taken
        assert Path(taken["path"]).parent == story.series, taken
    first = saved[0]
    said = f"hpcvm: cluster {NAME}: periodic checkpoint {first['seq']} at "
    assert said in story.first_run and " saved in " in story.first_run, story.first_run
    assert f"checkpoints: every {EVERY}" in story.first_run, story.first_run
    # one series: the signal's checkpoint numbered between the first run's periodic
    # ones and the second run's
    seqs = [t["seq"] for t in saved]
    assert story.signal_seq not in seqs, (story.signal_seq, seqs)
    assert min(seqs) < story.signal_seq < max(seqs), (story.signal_seq, seqs)
    assert "requeueing job" in story.first_run and ": saved" in story.first_run


def test_a_drained_node_without_a_spare_had_the_job_saved_and_requeued(story: Story) -> None:
    """The keeper saw node2 drain (Slurm's own state, with the admin's reason) and, with
    no spare node, signalled the batch script, whose trap saved the job and requeued it."""
    said = f"node node2 drains ({REASON} ["
    assert said in story.keeper_said, story.keeper_said
    assert "sent the batch script SIGUSR1" in story.keeper_said, story.keeper_said
    assert "signalled: saving cluster ck" in story.first_run, story.first_run
    assert "a node that drains: checkpoint" in story.first_run, story.first_run


def test_a_failed_periodic_checkpoint_was_said_and_left_the_last_complete_one(
    story: Story,
) -> None:
    """While the series' file system was full, the keeper's checkpoints failed: each
    is in the history with its reason and was said in the job's output; the VMs ran on
    (the ring's output is whole, test_the_mpi_job_went_on_across_the_checkpoint), the
    last complete checkpoint stayed, and nothing half written was left."""
    failed = [
        t for t in story.history if not t["ok"] and t["seq"] <= story.signal_seq
    ]  # a failed save leaves no member: the signal's took its number
    assert failed and all("No space left on device" in t["error"] for t in failed), failed
    # and no other failure than the save the test killed and those whose steps could not
    # reach node4 while its link was down: none for a job that had gone (a keeper once
    # tried a periodic checkpoint of the job its signal had saved)
    others = [t for t in story.history if not t["ok"] and t not in failed]
    cut_off = [t for t in others if _during_an_outage(story, t)]
    assert all("node4" in t["error"] for t in cut_off), cut_off
    # a periodic save still running when the test killed the VM's QEMU fails too (the
    # keeper's interval can come before cluster wait sees the lost VM): that is right
    lost = [t for t in others if float(t["at"]) + float(t["seconds"]) >= story.vm_killed_at]
    killed = [t for t in others if t not in cut_off and t not in lost]
    assert killed and all("node4: task 1: Killed" in t["error"] for t in killed), [
        (t["seq"], t["at"], t["error"]) for t in others
    ]
    said = FAILED.findall(story.first_run)
    assert said and "the last complete checkpoint stays" in said[0], story.first_run
    first = min(t["seq"] for t in story.history if t["ok"])  # the first periodic one
    assert f"checkpoint-{first:06d}" in story.held_at_failure, story.held_at_failure
    assert not [n for n in story.held_at_failure if "partial" in n], story.held_at_failure
    assert all(t["seq"] > first for t in failed)


def _during_an_outage(story: Story, taken: dict[str, Any]) -> bool:
    """Whether the checkpoint ``taken`` (a history entry: its start and seconds) ran
    while node4's link was down."""
    start, end = float(taken["at"]), float(taken["at"]) + float(taken["seconds"])
    return any(start <= o.up_at and end >= o.down_at for o in (story.outage, story.long_outage))


def test_a_link_down_for_10_s_and_the_job_went_on(story: Story) -> None:
    """node4's link down for 10 s while the ring's messages cross it: the job ran on
    (the ring's answer is exact: test_the_mpi_job_went_on_across_the_checkpoint), and
    its next periodic checkpoint after the link's return was saved."""
    assert story.outage.seconds >= LINK_DOWN_SECONDS
    assert SAID.search(story.outage.said_after), story.outage
    assert "lost a VM" not in story.outage.said_during + story.outage.said_after


def test_a_link_down_for_60_s_and_the_job_went_on(story: Story) -> None:
    """node4's link down for 60 s (half Slurm's SlurmdTimeout here: the node is not
    called down): the guests' TCP connections retransmit across it, the job ran on to
    the ring's exact end (test_the_mpi_job_went_on_across_the_checkpoint), and once
    the link was back a periodic checkpoint was saved."""
    assert story.long_outage.seconds >= LONG_LINK_DOWN_SECONDS
    assert SAID.search(story.long_outage.said_after), story.long_outage
    assert "lost a VM" not in story.long_outage.said_during + story.long_outage.said_after


def test_a_save_killed_on_one_node_failed_that_checkpoint_only(story: Story) -> None:
    """node4's save task killed midway: that checkpoint failed, said at once with the
    node; the VMs ran again (the ring went on to its exact end), the last complete
    checkpoint stayed and no half-written one was left."""
    said = FAILED.findall(story.killed_save)
    assert said and "node4" in said[0] and "save" in said[0], story.killed_save
    assert "the last complete checkpoint stays" in said[0], said[0]
    complete = [n for n in story.held_after_kill if n.startswith("checkpoint-")]
    assert complete and not [n for n in story.held_after_kill if "partial" in n], complete


def test_a_lost_vm_ended_the_wait_and_the_newest_periodic_checkpoint_was_restored(
    story: Story,
) -> None:
    second = story.second_run[len(story.first_run) :]
    errors = [line for line in second.splitlines() if "lost a VM while its program ran" in line]
    assert len(errors) == 1 and story.killed in errors[0], second
    assert "its newest complete checkpoint is" in errors[0], errors[0]
    assert "a node's VM was lost; the next start restores the newest checkpoint" in second
    newest = max(t["seq"] for t in story.history if t["ok"])
    third = story.text[len(story.second_run) :]
    assert "(restart 2)" in third, third
    assert f"is checkpoint-{newest:06d}" in third, third
    rows = {(node, vm) for node, vm, *_ in _ready_rows(third)}
    assert rows == {(FIRST[0], f"{NAME}-node1"), (FIRST[1], f"{NAME}-node2")}, third


def test_the_restored_vcpus_ran_in_their_new_nodes_cpusets(story: Story) -> None:
    after = story.text[len(story.first_run) :]
    checked = 0
    for node, _vm, state, _addr, pins in PS_ROW.findall(after):
        cpuset = cluster_support.node_cpuset(node)
        if state != "ready" or cpuset is None:
            continue
        pus = {int(p.split("->")[1]) for p in pins.split(",") if "->" in p}
        assert pus and pus <= cpuset[0], (node, pins, cpuset)
        checked += 1
    if checked == 0:
        pytest.skip("the test cluster made no cpusets here (docs/cluster-testing.md)")


def test_the_checkpoint_is_gone_once_the_job_ended(story: Story) -> None:
    assert not story.series.exists()
    assert not list(story.series.parent.glob(".checkpoint*partial*"))
    assert vm_count(VMS) == 0
    assert not _keepers(NAME)


# -- refusals: nothing may start from a bad checkpoint ------------------------------------

REFUSE_SCRIPT = """#!/bin/bash
"$HPCVM" cluster up --name bad --restore "$1" ${2:+$2}
echo "rc=$?"
"""


def _restore_in_job(story: Story, directory: Path, nodes: int = 2, extra: str = "") -> str:
    script = story.workdir / "refuse.sh"
    script.write_text(REFUSE_SCRIPT)
    os.chown(script, cluster_support.TEST_UID, cluster_support.TEST_UID)
    script.chmod(0o755)
    out = story.workdir / f"refuse-{directory.name}-{nodes}.out"
    argv = ["sbatch", "--wait", "-N", str(nodes), f"--nodelist={','.join(THEN[:nodes])}",
            f"--chdir={story.workdir}", f"--output={out}", str(script), str(directory)]  # fmt: skip
    if extra:
        argv.append(extra)
    story.cluster.run(argv, env={"HPCVM": story.hpcvm}, user=cluster_support.TEST_USER,
                      check=False, timeout=600)  # fmt: skip
    return _text(out)


def _copy(story: Story, name: str) -> Path:
    target = story.workdir / name
    subprocess.run(["cp", "-a", str(story.saved), str(target)], check=True)
    return target


def _refused(text: str, expected: str) -> None:
    errors = [line for line in text.splitlines() if line.startswith("hpcvm: error:")]
    assert len(errors) == 1 and expected in errors[0], text
    assert "rc=0" not in text and re.search(r"^rc=\d+$", text, re.M), text
    assert vm_count(VMS) == 0


def test_a_checkpoint_without_its_manifest_is_refused(story: Story) -> None:
    bad = _copy(story, "no-manifest")
    (bad / "job.json").unlink()
    _refused(_restore_in_job(story, bad), "not a complete job checkpoint")


def test_a_truncated_vm_state_is_refused_and_no_vm_runs(story: Story) -> None:
    bad = _copy(story, "truncated")
    state = bad / "vm-1" / "state.bin"
    with state.open("r+b") as fh:
        fh.truncate(state.stat().st_size // 2)
    text = _restore_in_job(story, bad)
    _refused(text, "truncated")
    assert "node3" not in [line for line in text.splitlines() if "ready at" in line]


def test_a_checkpoint_of_two_vms_is_refused_in_a_one_node_job(story: Story) -> None:
    _refused(_restore_in_job(story, story.saved, nodes=1), "holds 2 VMs")


def test_vm_options_are_refused_with_restore(story: Story) -> None:
    _refused(_restore_in_job(story, story.saved, extra="--vcpus=2"), "--vcpus")


def test_the_user_image_must_be_the_one_under_the_overlays(story: Story) -> None:
    bad = _copy(story, "other-image")
    for manifest in bad.glob("vm-*/manifest.json"):
        data = json.loads(manifest.read_text())
        data["base_image"]["mtime_ns"] += 1
        manifest.write_text(json.dumps(data))
    _refused(_restore_in_job(story, bad), "changed since checkpoint")
    shutil.rmtree(bad, ignore_errors=True)


# -- scancel in the middle of a restore, and of a save -----------------------------------

RESTORE_SCRIPT = """#!/bin/bash
"$HPCVM" cluster up --name rs --restore "$@"
echo "rc=$?"
if [ -n "${HPCVM_MOVE:-}" ]; then
    # shellcheck disable=SC2086  # --node A --to B
    "$HPCVM" cluster migrate rs $HPCVM_MOVE
    echo "migrate-rc=$?"
    "$HPCVM" cluster ps rs
    echo "shown after the move"
fi
"$HPCVM" cluster wait rs
echo "wait-rc=$?"
"""
CLAIMS = Path(os.environ.get("HPCVM_ADDRESS_CLAIMS", "/dev/shm/hpcvm-addresses"))


def _digests(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _claims() -> set[str]:
    return {p.name for p in CLAIMS.iterdir()} if CLAIMS.is_dir() else set()


def _restoring_job(
    story: Story,
    copy: Path,
    *extra: str,
    nodes: tuple[str, ...] = THEN,
    env: dict[str, str] | None = None,
) -> tuple[str, Path]:
    """A job of the test user restoring ``copy`` on ``nodes`` (``cluster up --restore
    COPY EXTRA...``, a move where HPCVM_MOVE says, then ``cluster wait``); its id and
    output file."""
    script = story.workdir / "restore.sh"
    script.write_text(RESTORE_SCRIPT)
    os.chown(script, cluster_support.TEST_UID, cluster_support.TEST_UID)
    script.chmod(0o755)
    out = story.workdir / f"restore-{copy.name}.out"
    argv = ["sbatch", "-N", str(len(nodes)), f"--nodelist={','.join(nodes)}",
            f"--chdir={story.workdir}", f"--output={out}", "--parsable", str(script), str(copy),
            *extra]  # fmt: skip
    done = story.cluster.run(argv, env={"HPCVM": story.hpcvm, **(env or {})},
                             user=cluster_support.TEST_USER)  # fmt: skip
    return done.stdout.strip().split(";")[0], out


def _cancelled_leaving_nothing(story: Story, job: str, claims: set[str]) -> None:
    """Cancel ``job`` as its user; then nothing of it may be left on any node: QEMU,
    tap, address claim, run directory, the cluster's state, the keeper."""
    story.cluster.run(["scancel", job], user=cluster_support.TEST_USER, check=False)
    wait_until("the job to end", lambda: job_state(story.cluster, job)
               in ("GONE", "CANCELLED", "COMPLETED", "FAILED"), timeout=180)  # fmt: skip
    wait_until("the restored VMs to go", lambda: vm_count(VMS) == 0, timeout=120)
    wait_until("a moved-in VM to go", lambda: vm_count("rs-node") == 0, timeout=120)
    site = SlurmSite(story.cluster, story.hpcvm)
    root = site.runtime_root()
    wait_until("the state to go", lambda: not (root / ".clusters" / "rs").exists(), timeout=60)
    assert sorted(p.name for p in root.glob(f"{VMS}*")) == []
    assert sorted(p.name for p in root.glob("rs-node*")) == []
    assert site.extra_links() == {}
    assert _claims() <= claims, _claims() - claims
    assert not _keepers("rs")


def _keepers(name: str) -> list[int]:
    return cluster_support.pids_with([b"keeper\x00" + name.encode() + b"\x00"])


def _user_copy(story: Story, name: str) -> Path:
    copy = _copy(story, name)
    subprocess.run(["chown", "-R", f"{cluster_support.TEST_UID}:{cluster_support.TEST_UID}",
                    str(copy)], check=True)  # fmt: skip
    return copy


def test_scancel_during_a_restore_leaves_nothing_and_the_checkpoint_intact(story: Story) -> None:
    """The user cancels a job while its VMs are being restored (QEMU loading the saved
    state on both nodes): every QEMU, tap, address claim, run and state directory goes,
    on every node, and the checkpoint read from is as it was, so the next job can
    restore it (this module's story restored the same bytes)."""
    copy = _user_copy(story, "cancelled")
    before, claims = _digests(copy), _claims()
    job, out = _restoring_job(story, copy)
    try:
        deadline = time.monotonic() + 300  # polled often: a restore takes seconds
        while vm_count(VMS) == 0 and time.monotonic() < deadline:  # the saved VMs' names
            time.sleep(0.1)
        restoring = "restored and running" not in _text(out)
    finally:
        _cancelled_leaving_nothing(story, job, claims)
    assert restoring, _text(out)
    assert _digests(copy) == before
    assert "rc=0" not in _text(out), _text(out)


def test_scancel_during_a_save_keeps_a_complete_restorable_checkpoint(story: Story) -> None:
    """A restored job saving itself every 3 s into a new series is cancelled while its
    second save runs on the nodes: nothing of the job is left; the first save, complete
    before, is unchanged unless the second completed before the job's end (the keeper
    finishes a save it began, within Slurm's KillWait) and replaced it; either way the
    series' newest complete checkpoint restores."""
    copy = _user_copy(story, "saving")
    series = story.series.parent / "cancelled-series"
    claims = _claims()
    job, out = _restoring_job(story, copy, "--checkpoint-every", "3s", "--checkpoint-dir",
                              str(series), "--checkpoint-keep", "1")  # fmt: skip

    def complete() -> list[Path]:
        return sorted(p.parent for p in series.glob("checkpoint-*/job.json"))

    def running() -> bool:
        return job_state(story.cluster, job) in ("PENDING", "RUNNING")

    try:
        wait_until("a first periodic checkpoint", lambda: bool(complete()) or not running(),
                   timeout=300)  # fmt: skip
        (first,) = complete()
        before = _digests(first)
        wait_until("the next save on the nodes", lambda: bool(_phase_tasks("save", THEN[1]))
                   or not running(), timeout=120)  # fmt: skip
        saving = bool(_phase_tasks("save", THEN[1]))
    finally:
        _cancelled_leaving_nothing(story, job, claims)
    assert saving, _text(out)
    kept = complete()
    assert len(kept) == 1, kept  # --checkpoint-keep 1
    if kept == [first]:
        assert _digests(first) == before
    text = _restore_in_job(story, series)
    assert "rc=0" in text and "restored and running" in text, text


@dataclass
class Moving:
    """A restored job with a spare, moving its second VM (node3 to node4) with the
    source step held still at a phase of the move (HPCVM_MIGRATE_HOLD)."""

    job: str
    out: Path
    claims: set[str]
    seen: dict[str, Any]  # the source step's moving marker, as last read

    def reached(self, story: Story, phase: str) -> bool:
        """Poll until the source step's marker says ``phase`` (and, for ``sending``,
        the target's QEMU waits for the state), or the job ended; whether it did."""
        marker = _root(story) / SECOND / "moving"

        def look() -> bool:
            with contextlib.suppress(OSError, ValueError):
                self.seen.update(json.loads(marker.read_text()))
            there = self.seen.get("phase") == phase
            if phase == "sending":
                there = there and vm_count(MOVED_IN) > 0
            return there or not self.running(story)

        wait_until(f"the move to reach {phase}", look, timeout=300)
        return self.seen.get("phase") == phase and self.running(story)

    def running(self, story: Story) -> bool:
        return job_state(story.cluster, self.job) in ("PENDING", "RUNNING")


ROW = re.compile(r"^│ (node\d) +│ (\S*) +│ (\w+) +│ (\S*) +│ (\S*) +│", re.M)  # spares too
SECOND = f"{NAME}-node2"  # the restored job's second VM (saved on node2, runs on node3)
MOVED_IN = "rs-node4"  # its name once it moved to node4


def _root(story: Story) -> Path:
    return SlurmSite(story.cluster, story.hpcvm).runtime_root()


def _moving_job(story: Story, name: str, hold: str) -> Moving:
    copy = _user_copy(story, name)
    claims = _claims()
    env = {"HPCVM_MOVE": "--node node3 --to node4", "HPCVM_MIGRATE_HOLD": hold}
    job, out = _restoring_job(story, copy, "--spare", "1", nodes=("node2", "node3", "node4"),
                              env=env)  # fmt: skip
    return Moving(job, out, claims, {})


def test_scancel_during_a_migration_leaves_nothing(story: Story) -> None:
    """A restored job with a spare node moves its second VM (node3 to node4) and is
    cancelled while the move is under way (the source step's own marker says it sends
    or stands paused; HPCVM_MIGRATE_HOLD holds it there): nothing of the job is
    left on any node, neither the VM at its source nor the copy the target took in."""
    move = _moving_job(story, "moving", "paused:120")
    try:
        paused = move.reached(story, "paused")
    finally:
        _cancelled_leaving_nothing(story, move.job, move.claims)
    assert paused, _text(move.out)
    assert "migrate-rc=0" not in _text(move.out), _text(move.out)


def _node_task(node: str, job: str) -> list[int]:
    """The pids of ``job``'s hpcvm node task on ``node`` (the holder step's task)."""
    return cluster_support.pids_with(
        [b"hpcvm.cluster.internal\x00node\x00"],
        [f"SLURMD_NODENAME={node}\x00".encode(), f"SLURM_JOB_ID={job}\x00".encode()],
    )


@pytest.mark.parametrize("phase", ["sending", "paused", "told"])
def test_a_move_whose_target_task_died_said_so_and_left_nothing(story: Story, phase: str) -> None:
    """A restored job with a spare moves its second VM (node3 to node4); node4's hpcvm
    task, which takes the copy in, is SIGKILLed while the source step is held at a
    phase (HPCVM_MIGRATE_HOLD): ``sending`` (node4 accepted the offer and its QEMU
    waits for the state), ``paused`` (QEMU done sending, the VM stands still at node3,
    "go" not yet said) or ``told`` (node4 was told to run it). The step ends with that
    task (srun ends a step whose task died), and the script's ``cluster wait`` says so
    in one line naming node4's task, with the lost-node exit status, where it once said
    "no cluster named" (the holder's note); ``cluster migrate`` does not say the VM
    runs on at node3 when the job ended (unless the move had succeeded by then: node4
    may have answered before it died); then nothing of the job is left on any node."""
    move = _moving_job(story, f"target-killed-{phase}", f"{phase}:8")
    targets: list[int] = []
    try:
        reached = move.reached(story, phase)
        targets = _node_task("node4", move.job)
        for pid in targets:
            os.kill(pid, signal.SIGKILL)
        wait_until("the job's wait to end", lambda: "wait-rc=" in _text(move.out)
                   or not move.running(story), timeout=180)  # fmt: skip
        text = _text(move.out)
    finally:
        _cancelled_leaving_nothing(story, move.job, move.claims)
    assert reached and targets, (move.seen, targets, text)
    moved = re.search(r"^migrate-rc=(\d+)$", text, re.M)
    assert moved is not None, text
    if phase != "told":
        assert moved.group(1) != "0", text
    if moved.group(1) != "0":
        failed = [ln for ln in text.splitlines() if "hpcvm: error: migrating" in ln]
        assert failed and "then the job ended" in failed[0], text
        assert "it runs on at node3" not in failed[0].split("then the job ended")[1], text
    assert "wait-rc=11" in text, text
    lines = [ln for ln in text.splitlines() if "cluster rs ended while its job ran" in ln]
    assert lines and "node4: task" in lines[0], text


def _running(story: Story, vm: str) -> bool:
    """QEMU's own word (QMP) on whether ``vm`` runs."""
    from hpcvm.runtime.channels import qmp

    status = qmp.execute(str(_root(story) / vm / "qmp.sock"), "query-status")
    return bool(status["running"])


@pytest.mark.parametrize("phase", ["sending", "go", "told"])
def test_a_move_whose_source_step_died_was_settled_and_the_job_went_on(
    story: Story, phase: str
) -> None:
    """The source step of a move (node3 to node4) is SIGKILLed at ``sending`` (node4
    accepted the offer and its QEMU waits for the state; node3's task finds the dead
    step and keeps the VM running; ``cluster migrate``, which asks node3 how far the
    step got, fails at once in one line), at ``go`` (just before it tells node4 to run
    the VM: node4 never does, tears its copy down and listens again) or at ``told``
    (node4 was told, and runs it). From ``go`` on node3's task keeps the VM paused,
    since only node4 knows; ``cluster migrate`` learns it from node4's events and
    settles node3 by a step of its own: the VM resumed at node3 (the move failed), or
    node3's paused copy taken down and the move standing (node3 a spare). No VM is left
    paused, the job goes on, and once it is cancelled nothing of it is left on any
    node."""
    move = _moving_job(story, f"source-killed-{phase}", f"{phase}:30")
    try:
        reached = move.reached(story, phase)
        if reached:
            os.kill(int(move.seen["pid"]), signal.SIGKILL)
        wait_until("the move to be settled", lambda: "shown after the move" in _text(move.out)
                   or not move.running(story), timeout=300)  # fmt: skip
        text = _text(move.out)
        went_on = move.running(story)
        runs = _running(story, MOVED_IN if phase == "told" else SECOND)
        left = vm_count(SECOND) if phase == "told" else vm_count(MOVED_IN)
    finally:
        _cancelled_leaving_nothing(story, move.job, move.claims)
    assert reached, (move.seen, _text(move.out))
    assert went_on and runs and left == 0, text
    rc = re.search(r"^migrate-rc=(\d+)$", text, re.M)
    shown = text.split("migrate-rc=", 1)[-1]
    rows = {n: st for n, _vm, st, *_ in ROW.findall(shown)}
    if phase == "sending":  # the node's task resumed it (it never stood still)
        assert rc is not None and rc.group(1) != "0", text
        assert "before it told node4 to run the VM (sending)" in text, text
    elif phase == "go":
        assert rc is not None and rc.group(1) != "0", text
        assert "node4 does not run the VM; at node3: resumed here" in text, text
        assert rows.get("node3") == "ready" and rows.get("node4") == "spare", shown
    else:
        assert rc is not None and rc.group(1) == "0", text
        assert "moved from node3 to node4 as rs-node4" in text, text
        assert "its source step died" in text and "marked moved" in text, text
        assert rows.get("node4") == "ready" and rows.get("node3") == "spare", shown


def test_the_time_limits_signal_during_a_periodic_save_waits_for_it_then_saves(
    story: Story, image: Path
) -> None:
    """The job script (docs/examples/hpcvm-checkpoint-job.sh) restores a series holding
    a copy of the signal's checkpoint on node3 and node4, saving itself every 3 s. Slurm's
    time-limit warning (``scancel --signal=USR1 --batch``, what ``--signal=B:USR1@600``
    sends) comes while a periodic save runs on the nodes: the script's own checkpoint
    waits for that save instead of failing on the busy job, then saves the job as the
    series' newest checkpoint, complete, and requeues it; nothing half written is left.
    (Past the time limit itself Slurm ends the job with SIGTERM, KillWait and SIGKILL,
    the signals of scancel: test_scancel_during_a_save_keeps_a_complete_restorable_...)"""
    series = story.workdir / "limit-series"
    series.mkdir()
    subprocess.run(["cp", "-a", str(story.saved), str(series / "checkpoint-000001")], check=True)
    subprocess.run(["chown", "-R", f"{cluster_support.TEST_UID}:{cluster_support.TEST_UID}",
                    str(series)], check=True)  # fmt: skip
    site = SlurmSite(story.cluster, story.hpcvm)
    env = site.job_env("lm", HPCVM_MEMORY="384M", HPCVM_CHECKPOINT=str(series),
                       HPCVM_CHECKPOINT_EVERY="3s", HPCVM_IMAGE=str(image))  # fmt: skip
    out = story.workdir / "limit.out"
    argv = ["sbatch", "-N", "2", f"--nodelist={','.join(THEN)}", f"--chdir={story.workdir}",
            f"--output={out}", "--parsable", str(SCRIPT), "/usr/local/bin/mpi_ring"]  # fmt: skip
    user = cluster_support.TEST_USER
    job = story.cluster.run(argv, env=env, user=user).stdout.strip().split(";")[0]
    claims = _claims()

    def running() -> bool:
        return job_state(story.cluster, job) in ("PENDING", "RUNNING")

    try:
        wait_until("a first periodic checkpoint", lambda: "checkpoint-000002" in
                   {p.name for p in series.iterdir()} or not running(), timeout=300)  # fmt: skip
        wait_until("the next save on the nodes", lambda: bool(_phase_tasks("save", THEN[1]))
                   or not running(), timeout=120)  # fmt: skip
        saving = bool(_phase_tasks("save", THEN[1]))
        story.cluster.run(["scancel", "--signal=USR1", "--batch", job], user=user)
        wait_until("the requeue", lambda: "requeueing job" in _text(out)
                   or not running(), timeout=300)  # fmt: skip
        text = _text(out)
        kept = sorted(p.name for p in series.iterdir())
    finally:
        story.cluster.run(["scancel", job], user=user, check=False)
        wait_until("the job to end", lambda: job_state(story.cluster, job)
                   in ("GONE", "CANCELLED", "COMPLETED", "FAILED"), timeout=180)  # fmt: skip
        wait_until("its VMs to go", lambda: vm_count(VMS) == 0, timeout=120)
    assert saving, text
    assert "signalled: saving cluster lm" in text and "requeueing job" in text, text
    assert "the checkpoint failed" not in text, text
    members = sorted(n for n in kept if n.startswith("checkpoint-"))
    assert members and (series / members[-1] / "job.json").is_file(), kept
    assert int(members[-1].split("-")[1]) >= 3, kept  # the keeper's, then the script's
    assert not [n for n in kept if "partial" in n], kept
    assert _claims() <= claims
    assert not (site.runtime_root() / ".clusters" / "lm").exists()
