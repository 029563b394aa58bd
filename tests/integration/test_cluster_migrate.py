"""One node's VM moved to a third node while an MPI program runs across the job's two
VMs, by the user and then by the job's keeper when the admin drains its node, submitted
by the unprivileged test user to the Slurm test cluster (scripts/test-cluster.sh,
cgroup plugins), as a site's user would.

The story (one job, module scope): a 3-node job (node1, node2, node3) starts a VM on
node1 and node2 from the test image with node3 spare (``cluster up --spare 1 --on-drain
migrate``), starts the MPI ring detached, moves node2's VM to node3 (``cluster
migrate``), shows ``cluster ps``, starts a move back whose source step the test kills
outright while the VM stands still (before "go": the VM must run on at node3), and waits
for the ring with ``cluster wait``. Meanwhile the test, as the admin, drains node3
(``scontrol update State=DRAIN``, as before maintenance): the job's keeper moves the VM
back to node2, the spare again. The script shows ``cluster ps``, collects the ring's
output and takes the job down; the test resumes node3.

Oracles independent of hpcvm: the MPI program's own output (every round once, in order,
and a counter that is right only when no message was lost or repeated; Open MPI's TCP
transport does not reconnect, so a connection broken by a move would abort it), Slurm's
own view of node3 (drained), the kernel's cpuset of node3 for where the moved vCPU
runs, and /proc for QEMU processes left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import cluster_support
from tests.cluster_support import LocalCluster, job_state, vm_count
from tests.sites import SlurmSite, wait_until

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster
user_hpcvm = cluster_support.user_hpcvm
image = cluster_support.image

NAME = "mg"
VMS = f"{NAME}-node"  # every VM of the job: NAME-<node>
ROUNDS = 160  # 80 s of ring: it outlasts two moves, a failed one and the drain
DELAY_MS = 500
ROUND = re.compile(r"^round=(\d+) counter=(\d+) host=(\S+) peer=(\S+)$", re.M)
PS_ROW = re.compile(r"^│ (node\d) +│ (\S*) +│ (\w+) +│ (\S*) +│ (\S*) +│", re.M)
MOVED = re.compile(r"moved from node2 to node3 as (\S+) at (\S+); the guest stood still (\d+) ms")
REASON = "hpcvm-test-maintenance"
JOB_TIMEOUT = 1500.0  # two disk-image guests booting under TCG, the ring, the move

SCRIPT = """#!/bin/bash
set -uo pipefail
h=$HPCVM
"$h" cluster up --name {name} --spare 1 --on-drain migrate --image "$HPCVM_IMAGE" \\
    --profile hpc --vcpus 1 --memory 384M --address auto $HPCVM_UP_OPTIONS || exit 1
"$h" cluster ps {name}
"$h" cluster exec --detach {name} -- mpirun -np 2 --map-by node \\
    /usr/local/bin/mpi_ring {rounds} {delay}
sleep 6
"$h" cluster migrate {name} --node node2 --to node3; echo "migrate-rc=$?"
"$h" cluster ps {name}
echo "shown after the move"
HPCVM_MIGRATE_HOLD=paused:60 "$h" cluster migrate {name} --node node3 --to node2
echo "killed-migrate-rc=$?"
"$h" cluster ps {name}
echo "shown after the killed move"
"$h" cluster wait {name} --timeout 900; echo "wait-rc=$?"
"$h" cluster ps {name}
"$h" cluster down {name}
"""


@dataclass
class Story:
    cluster: LocalCluster
    job: str
    text: str
    runtime_root: Path  # where the test user's VMs' run directories are
    drained: str  # Slurm's own line for node3 once the job ended
    killed: dict[str, Any]  # the moving marker of the source step the test killed


@pytest.fixture(scope="module")
def story(slurm_cluster: LocalCluster, user_hpcvm: Path, image: Path) -> Iterator[Story]:
    site = SlurmSite(slurm_cluster, str(user_hpcvm))
    with cluster_support.user_dir("hpcvm-migrate-") as work:
        script = work / "job.sh"
        script.write_text(SCRIPT.format(name=NAME, rounds=ROUNDS, delay=DELAY_MS))
        script.chmod(0o755)
        env = site.job_env(
            NAME,
            HPCVM_IMAGE=str(image),
            HPCVM_UP_OPTIONS="--accel tcg --housekeeping 0 --timeout 900 --ready-timeout 600",
        )
        out = work / "job.out"
        argv = ["sbatch", "-N", "3", "--nodelist=node1,node2,node3", f"--chdir={work}",
                f"--output={out}", "--parsable", str(script)]  # fmt: skip
        done = slurm_cluster.run(argv, env=env, user=cluster_support.TEST_USER)
        job = done.stdout.strip().split(";")[0]

        def ended() -> bool:
            return job_state(slurm_cluster, job) not in ("PENDING", "RUNNING", "COMPLETING")

        try:
            wait_until("the user's move", lambda: "shown after the move" in _text(out) or ended(),
                       timeout=JOB_TIMEOUT)  # fmt: skip
            killed = _kill_paused_source(site.runtime_root() / f"{NAME}-node3", ended)
            wait_until("the killed move to be settled", lambda: "shown after the killed move"
                       in _text(out) or ended(), timeout=300)  # fmt: skip
            holder_log = site.runtime_root() / ".clusters" / NAME / "holder.log"
            killed["holder_log"] = _text(holder_log)  # the job's state goes with it
            slurm_cluster.run(["scontrol", "update", "NodeName=node3", "State=DRAIN",
                               f"Reason={REASON}"])  # fmt: skip
            wait_until("the job to end", ended, timeout=JOB_TIMEOUT)
            drained = slurm_cluster.run(["scontrol", "show", "node", "--oneliner", "node3"])
            yield Story(slurm_cluster, job, _text(out), site.runtime_root(), drained.stdout,
                        killed)  # fmt: skip
        finally:
            slurm_cluster.run(["scontrol", "update", "NodeName=node3", "State=RESUME"],
                              check=False)  # fmt: skip
            slurm_cluster.run(["scancel", job], check=False)
            wait_until(
                "the job's VMs to go",
                lambda: vm_count(VMS) == 0,
                timeout=120,
            )


def _text(out: Path) -> str:
    return out.read_text(errors="replace") if out.is_file() else ""


def _kill_paused_source(run_dir: Path, ended: Callable[[], bool]) -> dict[str, Any]:
    """SIGKILL the second move's source step once its VM stands still (the step's own
    ``moving`` marker says ``paused``; HPCVM_MIGRATE_HOLD holds it there), as a
    node task killed outright between QEMU's end and "go"; the marker it had."""
    marker = run_dir / "moving"
    seen: dict[str, Any] = {}

    def paused() -> bool:
        with contextlib.suppress(OSError, ValueError):
            seen.update(json.loads(marker.read_text()))
        return seen.get("phase") == "paused" or ended()

    wait_until("the second move's VM to stand still", paused, timeout=300)
    assert seen.get("phase") == "paused", seen
    os.kill(int(seen["pid"]), signal.SIGKILL)
    return seen


def test_the_mpi_program_went_on_across_the_move(story: Story) -> None:
    rounds = [(int(r), int(c), h, p) for r, c, h, p in ROUND.findall(story.text)]
    assert [r for r, *_ in rounds] == list(range(1, ROUNDS + 1)), story.text
    assert all(c == 2 * r for r, c, *_ in rounds), rounds
    assert f"done counter={2 * ROUNDS} expected={2 * ROUNDS}" in story.text
    assert "wait-rc=0" in story.text, story.text
    assert job_state(story.cluster, story.job) == "COMPLETED"


def test_the_vm_moved_mid_run_and_kept_its_address(story: Story) -> None:
    assert "migrate-rc=0" in story.text, story.text
    moved = MOVED.search(story.text)
    assert moved is not None, story.text
    before, after = story.text.split("migrate-rc=0", 1)
    after = after.split("wait-rc=", 1)[0]
    rows_before = {n: (vm, st, addr) for n, vm, st, addr, _ in PS_ROW.findall(before)}
    rows_after = {n: (vm, st, addr) for n, vm, st, addr, _ in PS_ROW.findall(after)}
    assert rows_before["node3"][1] == "spare", before
    assert rows_after["node3"] == (f"{NAME}-node3", "ready", rows_before["node2"][2]), after
    assert rows_after["node2"][1] == "spare", after
    assert moved.group(2) == rows_before["node2"][2]
    # the ring had not ended when the VM moved: it ran on after it
    last_round_before = max((int(r) for r, *_ in ROUND.findall(before)), default=0)
    assert last_round_before == 0  # its output waits in the first guest until cluster wait
    assert "done counter" not in before


def test_the_keeper_moved_the_vm_off_the_drained_node_to_the_spare(story: Story) -> None:
    """node3 drained (Slurm says so, with the admin's reason) while its VM ran: the
    keeper moved it to node2, the spare since the user's move, and node3 became the
    spare; the guest kept its address across both moves."""
    assert "DRAIN" in story.drained and REASON in story.drained, story.drained
    before = story.text.split("migrate-rc=0", 1)[0]
    end = story.text.split("wait-rc=", 1)[1]
    rows_before = {n: (vm, st, addr) for n, vm, st, addr, _ in PS_ROW.findall(before)}
    rows_end = {n: (st, addr) for n, _vm, st, addr, _ in PS_ROW.findall(end)}
    assert rows_end["node2"] == ("ready", rows_before["node2"][2]), end
    assert rows_end["node3"][0] == "spare", end
    assert "a node that drains: migrate" in story.text, story.text
    # cluster wait said it in the job's output as it happened
    assert f"hpcvm: cluster {NAME}: its VM 1 moved from node3 to node2" in story.text


def test_the_moved_vcpu_runs_in_node3s_cpuset(story: Story) -> None:
    after = story.text.split("migrate-rc=0", 1)[-1].split("wait-rc=", 1)[0]
    cpuset = cluster_support.node_cpuset("node3")
    if cpuset is None:
        pytest.skip("the test cluster made no cpusets here (docs/cluster-testing.md)")
    rows = [r for r in PS_ROW.findall(after) if r[0] == "node3" and r[2] == "ready"]
    assert rows, after
    pus = {int(p.split("->")[1]) for p in rows[0][4].split(",") if "->" in p}
    assert pus and pus <= cpuset[0], (rows, cpuset)


def test_a_move_whose_source_step_died_before_go_left_the_vm_running_where_it_was(
    story: Story,
) -> None:
    """The second move's source step killed outright while the VM stood still on node3
    (QEMU done sending, "go" not yet said): the move failed, node3's task resumed the
    VM there and said so, node2 went back to being the spare (the keeper's later move
    took the VM to it), and the ring ran on to its exact end."""
    node2 = next(n.address for n in story.cluster.nodes if n.name == "node2")
    assert story.killed["node"] == "node3", story.killed
    assert story.killed["target"].startswith(f"{node2}:"), story.killed  # node2's listener
    failed = re.search(r"^killed-migrate-rc=(\d+)$", story.text, re.M)
    assert failed is not None and failed.group(1) != "0", story.text
    said = (
        f"its migration to {story.killed['target']} was killed "
        f"(source step pid {story.killed['pid']} gone)"
    )
    lines = [line for line in story.killed["holder_log"].splitlines() if said in line]
    assert lines and "before the target was told to run it: resumed here" in lines[0], lines
    shown = story.text.split("killed-migrate-rc=", 1)[1].split("shown after the killed", 1)[0]
    assert said in shown, shown  # cluster ps shows it, where cluster migrate's error points
    between = story.text.split("killed-migrate-rc=", 1)[1].split("wait-rc=", 1)[0]
    rows = {n: (vm, st) for n, vm, st, _addr, _ in PS_ROW.findall(between)}
    assert rows["node3"] == (f"{NAME}-node3", "ready") and rows["node2"][1] == "spare", between


def test_nothing_is_left_once_the_job_ended(story: Story) -> None:
    wait_until("the job's VMs to go", lambda: vm_count(VMS) == 0, timeout=60)
    root = story.runtime_root
    left = sorted(p.name for p in root.glob(f"{NAME}-node*")) if root.is_dir() else []
    assert left == [], left
    assert "mg: down" in story.text, story.text
