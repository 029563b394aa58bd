"""Two unprivileged users on the same nodes (issue 38): one runs a 2-node MPI job in
VMs on the Slurm test cluster; the other, on those nodes while it runs, tries to take
its state, read its files, reach its VMs' control sockets and signal its QEMU, and
squats its address slots. Each attempt is refused by the kernel (EACCES, EPERM: the
OS's answer, not hpcvm's), and the job's MPI run completes with the right answer. On
the segment, the other user's own VM on the job VM's node and bridge tries to take the
job VM's, the node's and the controller's addresses and the job VM's MAC
(tests/segment_attempts.py): hpcvm-netguard drops it all, as the node's and the
controller's neighbour tables and nft's counters show.

The job's user (``VICTIM``) is made here, fresh, so that its runtime directory does not
exist yet and the other user, the cluster's test user (``OTHER``, hpcvm-test), can make
it first. One job and one module-wide setup (CI time): ``two_users`` does every step
once and records what happened; each test checks one part of it.

Real parts throughout: real users (useradd; Slurm resolves them through the system's
passwd), real sbatch/srun jobs confined by Slurm's cgroups, real TCG guests and Open
MPI, a real claims directory and hugetlbfs mount. Not run as a job: the other user's
attempts (tests/cluster/attempts.py) run in a shell on the job's node, as a user
logged in there would: each node has one CPU for jobs and the example job asks
``--exclusive``, so a second job on the same nodes would only queue behind the first.
What cannot be had here: a checkpoint of this job (the built-in guest's root is the
host's over 9p, which QEMU cannot save): the checkpoint the other user tries is one the
job's user writes with hpcvm's own checkpoint writer, on the node, into /tmp.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpcvm.cluster.tasks.addresses import DEFAULT_CLAIMS
from tests import cluster_support, segment_attempts
from tests.integration.test_cluster_job import JOB_SCRIPT, MPI_PING, RANK_LINE, qemu_of, read
from tests.sites import SlurmSite, auto_address, wait_until
from tests.users import in_child_as, process_as, remove_user

pytestmark = pytest.mark.integration

slurm_cluster = cluster_support.slurm_cluster
user_hpcvm = cluster_support.user_hpcvm

REPO = Path(__file__).resolve().parents[2]
ATTEMPTS = REPO / "tests" / "cluster" / "attempts.py"
VICTIM = os.environ.get("HPCVM_TEST_USER2", "hpcvm-test2")
VICTIM_UID = int(
    os.environ.get("HPCVM_TEST_UID2", "2389")
)  # below the ids useradd hands out (max + 1)
MARK = "hpcvm two-user test"  # the comment of the user this module makes
OTHER = cluster_support.TEST_USER
OTHER_UID = cluster_support.TEST_UID  # and its group: useradd gives it the same id
CLAIMS = Path(DEFAULT_CLAIMS)
HUGETLBFS = Path("/dev/hugepages-hpcvm")  # the node install's group mount (mode 1770)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "GONE")


@pytest.fixture(scope="module")
def victim(slurm_cluster: cluster_support.LocalCluster) -> Iterator[str]:
    """The job's user: unprivileged, in the site's group and kvm (as the cluster's test
    user, scripts/test-cluster.sh), made for this module and removed after it with its
    runtime directory (tests/users.remove_user)."""
    with contextlib.suppress(KeyError):
        if pwd.getpwnam(VICTIM).pw_gecos != MARK:
            pytest.fail(f"a user {VICTIM} exists that this test did not make: set HPCVM_TEST_USER2")
        remove_user(VICTIM)  # left by an interrupted run
    subprocess.run(
        ["useradd", "--uid", str(VICTIM_UID), "--user-group", "--create-home",
         "--groups", f"{cluster_support.SITE_GROUP},kvm", "--shell", "/bin/sh",
         "--comment", MARK, VICTIM],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield VICTIM
    finally:
        remove_user(VICTIM)


@dataclass
class TwoUsers:
    """What happened, step by step (``two_users``)."""

    name: str = f"u{os.getpid()}"
    premade: subprocess.CompletedProcess[str] | None = None
    premade_left: list[str] = field(default_factory=list)
    premade_qemus: int = 0
    squats: dict[Path, str] = field(default_factory=dict)  # squat file -> how it squats
    squats_kept: list[Path] = field(default_factory=list)  # still there after the boot
    nodes: list[str] = field(default_factory=list)  # the job's nodes, by VM
    claimed: list[str] = field(default_factory=list)  # the victim's claim files' addresses
    answers: dict[str, str] = field(default_factory=dict)  # attempt -> "ok" or errno name
    expected: dict[str, str] = field(default_factory=dict)  # attempt -> errno name
    segment: segment_attempts.SegmentAttempt | None = None  # the network attempts
    guards: dict[str, str] = field(default_factory=dict)  # node -> the job VM's tap's chain
    chains_running: dict[str, list[str]] = field(default_factory=dict)  # node -> chains
    chains_after: dict[str, list[str]] = field(default_factory=dict)  # after the job
    out: str = ""
    returncode: int | None = None


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def claims_dir_as_installed() -> None:
    """The claims directory as the node install makes it (root's, 1777): owned by a
    user (the first one whose hpcvm made it), it is trusted by no one else. The files
    in it, other jobs' live claims among them, are left as they are."""
    CLAIMS.mkdir(mode=0o1777, exist_ok=True)
    os.chown(CLAIMS, 0, 0)
    CLAIMS.chmod(0o1777)


def squat(cluster: cluster_support.LocalCluster, holder: int, target: Path) -> dict[Path, str]:
    """The other user squats every slot of every node twice, under the name older
    hpcvm wrote (``IP``) and under this one's (``IP.*``), each in one of the ways that
    must hold nothing: pid 1, another user's live pid (this test's), a symbolic link to
    a file naming their own live process, a FIFO, their own live process under another
    start time (a reused pid). Older hpcvm counted every one of these as a live claim
    (or hung on the FIFO): the job would have found no free slot."""
    me = os.getpid()
    made: dict[Path, str] = {}
    for k in range(1, len(cluster.nodes) + 1):
        slots = [auto_address(cluster_support.NET_PREFIX, k, s).split("/")[0] for s in range(4)]
        made |= {
            CLAIMS / slots[0]: "1\n",
            CLAIMS / f"{slots[0]}.squat-pid1": f"1 {start_time(1)}\n",
            CLAIMS / slots[1]: f"{me}\n",
            CLAIMS / f"{slots[1]}.squat-other": f"{me} {start_time(me)}\n",
            CLAIMS / slots[2]: "symlink",
            CLAIMS / f"{slots[2]}.squat-reused": f"{holder} 1\n",
            CLAIMS / slots[3]: "fifo",
            CLAIMS / f"{slots[3]}.squat-link": "symlink",
        }

    for path in made:  # what an earlier run left (its squatter's files outlive it)
        path.unlink(missing_ok=True)

    def make() -> None:
        target.write_text(f"{holder} {start_time(holder)}\n")
        for path, text in made.items():
            if text == "symlink":
                path.symlink_to(target)
            elif text == "fifo":
                os.mkfifo(path)
            else:
                path.write_text(text)

    assert in_child_as(OTHER_UID, OTHER_UID, make) is None
    return made


def try_premade_runtime_dir(
    cluster: cluster_support.LocalCluster, hpcvm: Path, seen: TwoUsers
) -> None:
    """The other user makes the victim's runtime directory first (0777); the victim's
    ``hpcvm up`` on a node must refuse it before anything starts; then the admin
    removes it, as the refusal says."""
    premade = Path(f"/tmp/hpcvm-{VICTIM_UID}")
    shutil.rmtree(premade, ignore_errors=True)

    def make() -> None:
        premade.mkdir()
        premade.chmod(0o777)

    assert in_child_as(OTHER_UID, OTHER_UID, make) is None
    up = [str(hpcvm), "up", "--name", f"{seen.name}-p", "--profile", "naive", "--vcpus", "1",
          "--memory", "256M", "--accel", "tcg"]  # fmt: skip
    seen.premade = cluster.run(up, node=cluster.nodes[0].name, user=VICTIM, check=False)
    seen.premade_left = sorted(p.name for p in premade.iterdir())
    seen.premade_qemus = cluster_support.vm_count(f"{seen.name}-p")
    shutil.rmtree(premade)  # the admin's fix


def write_checkpoint(
    cluster: cluster_support.LocalCluster, hpcvm: Path, node: str, target: Path
) -> None:
    """A checkpoint directory written by hpcvm's checkpoint writer as the victim, on the
    node, into /tmp (sticky): what ``hpcvm checkpoint`` makes of a disk-image guest."""
    code = (
        "import sys; from pathlib import Path\n"
        "from hpcvm.runtime.checkpoint import directory as c\n"
        "t = Path(sys.argv[1])\n"
        "with c.writing(t) as w:\n"
        "    w.write_text('state', 'the guest memory stands in here')\n"
        "    c.commit_directory(w.partial, 'manifest.json', '{}', t)\n"
    )
    python = str(hpcvm.parent / "python")
    cluster.run([python, "-c", code, str(target)], node=node, user=VICTIM)


def attempts(seen: TwoUsers, checkpoint: Path) -> list[list[str]]:
    """Every attempt of the other user against the running job, with the kernel's
    answer it must get (``seen.expected``)."""
    root = Path(f"/tmp/hpcvm-{VICTIM_UID}")
    vm = f"{seen.name}-{seen.nodes[0]}"
    state = root / ".clusters" / seen.name
    tries = [
        ["list the runtime directory", "list", str(root), "EACCES"],
        ["make a directory in it", "mkdir", str(root / "evil"), "EACCES"],
        ["replace the runtime directory", "rename", str(root), "/tmp/evil", "EPERM"],
        ["read the console log", "read", str(root / vm / "console.log"), "EACCES"],
        ["read the QEMU log", "read", str(root / vm / "qemu.log"), "EACCES"],
        ["read the machine record", "read", str(root / vm / "machine.json"), "EACCES"],
        ["read the QEMU pid file", "read", str(root / vm / "qemu.pid"), "EACCES"],
        ["connect to the QMP socket", "connect", str(root / vm / "qmp.sock"), "EACCES"],
        ["connect to the agent socket", "connect", str(root / vm / "agent.sock"), "EACCES"],
        ["connect to the agent relay", "connect", str(root / vm / "relay.sock"), "EACCES"],
        # the relay runs as the VM's owner (runtime/channels/agent_relay.py): read as root
        [
            "kill the agent relay",
            "kill",
            (root / vm / "relay.sock.pid").read_text().strip(),
            "EPERM",
        ],
        ["read the cluster record", "read", str(state / "cluster.json"), "EACCES"],
        ["read the job's ssh key", "read", str(state / "id_job"), "EACCES"],
        ["make a cluster state directory", "mkdir", str(root / ".clusters" / "evil"), "EACCES"],
        ["read a checkpoint file", "read", str(checkpoint / "state"), "EACCES"],
        ["list the checkpoint", "list", str(checkpoint), "EACCES"],
        ["move the checkpoint away", "rename", str(checkpoint), "/tmp/evil", "EPERM"],
    ]
    for path in sorted(HUGETLBFS.glob(f"hpcvm-*-{vm}-*")):
        tries += [
            ["list the VM's hugetlbfs directory", "list", str(path), "EACCES"],
            ["move the VM's hugetlbfs directory", "rename", str(path), str(HUGETLBFS / "evil"),
             "EPERM"],
        ]  # fmt: skip
    for path in sorted(p for p in CLAIMS.iterdir() if p.lstat().st_uid == VICTIM_UID):
        tries += [
            [f"remove the claim {path.name}", "unlink", str(path), "EPERM"],
            [f"rewrite the claim {path.name}", "write", str(path), "EACCES"],
        ]
    for line in qemu_of(seen.name):
        pid = line.split(":")[0]
        tries.append([f"kill QEMU pid {pid}", "kill", pid, "EPERM"])
    # network attempts: try_the_segment (tests/segment_attempts.py)
    seen.expected = {t[0]: t[-1] for t in tries}
    return [t[:-1] for t in tries]


def try_the_segment(cluster: cluster_support.LocalCluster, hpcvm: Path, seen: TwoUsers) -> None:
    """The job's VMs' taps guarded on both nodes; then, on the first node, the other
    user's own VM on the node's bridge tries to take the job VM's address and MAC, the
    node's and the controller's (tests/segment_attempts.py), and goes down again before
    the MPI run (the CPU back to the job)."""
    vms = {node: f"{seen.name}-{node}" for node in seen.nodes}
    seen.guards = {
        n: segment_attempts.guard_chain(cluster, VICTIM_UID, vm, n) for n, vm in vms.items()
    }
    seen.chains_running = {n: segment_attempts.node_chains(cluster, n) for n in seen.nodes}
    node = seen.nodes[0]
    attacker = segment_attempts.Attacker(cluster, hpcvm, OTHER, node, f"{seen.name}-x")
    seen.segment = segment_attempts.SegmentAttempt(node=node, attacker=attacker.name)
    try:
        segment_attempts.attempt(attacker, seen.segment, VICTIM_UID, vms[node])
    finally:
        attacker.down()


@pytest.fixture(scope="module")
def two_users(
    slurm_cluster: cluster_support.LocalCluster, user_hpcvm: Path, victim: str
) -> Iterator[TwoUsers]:
    """Every step once, in order: the squats, the pre-made runtime directory, the
    victim's job up to its MPI run, the other user's attempts, then the MPI run."""
    cluster, seen = slurm_cluster, TwoUsers()
    site = SlurmSite(cluster, str(user_hpcvm), user=victim)
    probe = cluster_support.as_user([str(user_hpcvm), "--version"], victim)
    assert probe.returncode == 0, probe.stderr
    claims_dir_as_installed()
    checkpoint = Path(f"/tmp/hpcvm-two-users-ckpt-{os.getpid()}")
    target = Path(f"/var/tmp/hpcvm-two-users-claim-{os.getpid()}")
    with contextlib.ExitStack() as stack, site.job_dir() as work:
        os.chown(work, VICTIM_UID, VICTIM_UID)
        stack.callback(shutil.rmtree, checkpoint, True)
        stack.callback(target.unlink, True)
        holder = stack.enter_context(process_as(OTHER_UID, OTHER_UID))
        seen.squats = squat(cluster, holder, target)
        for path in seen.squats:
            stack.callback(path.unlink, True)
        try_premade_runtime_dir(cluster, user_hpcvm, seen)
        exe = work / "mpi_ping"
        subprocess.run(["mpicc", "-O1", "-o", str(exe), str(MPI_PING)], check=True)
        hold = work / "hold.sh"
        # The guests see the job's directory through a read-only 9p share with cache=loose
        # (guest/scripts.py): a lookup of `go` before it exists stays negative there, so
        # the ranks wait for it in the directory's listing, which 9p reads anew each time.
        hold.write_text(
            f'#!/bin/sh\nuntil ls {work} | grep -qx go; do sleep 1; done\nexec {exe} "$@"\n'
        )
        for path in (exe, hold):
            path.chmod(0o755)
            os.chown(path, VICTIM_UID, VICTIM_UID)
        job = site.submit(JOB_SCRIPT, work, site.job_env(seen.name), str(hold))
        stack.callback(site.cancel, job)
        wait_until(
            "the job's VMs to be up (or the job to end)",
            lambda: (
                "2 VM(s) up" in read(job.out) or cluster_support.job_state(cluster, job.id) in ENDED
            ),
        )
        seen.squats_kept = [p for p in seen.squats if os.path.lexists(p)]
        seen.nodes = sorted(
            p.name.removeprefix(f"{seen.name}-") for p in site.runtime_root().glob(f"{seen.name}-*")
        )
        seen.claimed = sorted(
            p.name.split(".squat")[0].rsplit(".", 1)[0]
            for p in CLAIMS.iterdir()
            if p.lstat().st_uid == VICTIM_UID
        )
        if len(seen.nodes) == 2:
            write_checkpoint(cluster, user_hpcvm, seen.nodes[0], checkpoint)
            tries = attempts(seen, checkpoint)
            done = cluster.run(
                [str(user_hpcvm.parent / "python"), str(ATTEMPTS), json.dumps(tries)],
                node=seen.nodes[0], user=OTHER,
            )  # fmt: skip
            seen.answers = json.loads(done.stdout.strip().splitlines()[-1])
            try_the_segment(cluster, user_hpcvm, seen)
        (work / "go").touch()
        seen.returncode = site.wait(job)
        seen.out = read(job.out)
        seen.chains_after = {n: segment_attempts.node_chains(cluster, n) for n in seen.nodes}
        yield seen


def test_a_runtime_directory_another_user_made_first_is_refused(two_users: TwoUsers) -> None:
    """``hpcvm up`` as the victim with /tmp/hpcvm-UID made first by the other user,
    mode 0777: one line naming the directory and the fix (the admin's: only root may
    remove another user's directory), exit 2, nothing started, nothing written there."""
    done = two_users.premade
    assert done is not None
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    premade = f"/tmp/hpcvm-{VICTIM_UID}"
    assert line.startswith(
        f"hpcvm: error: hpcvm's runtime directory {premade} belongs to user {OTHER}, "
        f"not to you (user {VICTIM})"
    ), line
    assert f"ask your admin to remove it (`rm -r {premade}`)" in line, line
    assert two_users.premade_left == [] and two_users.premade_qemus == 0


def test_squatted_claims_hold_no_slot(two_users: TwoUsers) -> None:
    """Every slot of every node was squatted by the other user before the job: the
    job's VMs still claimed addresses of their nodes' slots, and the squats (which the
    victim may not remove in a sticky directory) are all still there."""
    assert len(two_users.nodes) == 2, two_users.out
    assert sorted(two_users.squats_kept) == sorted(two_users.squats)
    wanted = [
        {auto_address(cluster_support.NET_PREFIX, int(node.removeprefix("node")), s).split("/")[0]
         for s in range(4)}
        for node in two_users.nodes
    ]  # fmt: skip
    got = []
    for node, slots in zip(two_users.nodes, wanted, strict=True):
        row = re.search(rf"{two_users.name}-{node}\s*│\s*ready\s*│\s*([\d.]+)", two_users.out)
        assert row is not None and row.group(1) in slots, (node, slots, two_users.out)
        got.append(row.group(1))
    assert sorted(got) == two_users.claimed  # the files the victim's claims left, as listed


def test_every_attempt_of_the_other_user_is_refused_by_the_kernel(two_users: TwoUsers) -> None:
    assert two_users.answers == two_users.expected
    labels = " ".join(two_users.answers)
    assert "hugetlbfs" in labels and "claim" in labels and labels.count("kill QEMU") == 2


def test_the_victims_mpi_job_completes_with_the_right_answer(two_users: TwoUsers) -> None:
    text = two_users.out
    assert two_users.returncode == 0, text
    ranks = [m.groups() for m in map(RANK_LINE.match, text.splitlines()) if m]
    assert sorted((host, int(size), int(token)) for _, size, host, token in ranks) == [
        (f"{two_users.name}-{node}", 2, 43) for node in two_users.nodes
    ], text


def test_the_job_vms_taps_are_guarded_while_they_run_and_not_after(two_users: TwoUsers) -> None:
    """Each job VM's tap had its chain in its node's guard table (nft's own listing)
    while the job ran, and the chain went with the job's VMs; so did the attacker's."""
    assert sorted(two_users.guards) == two_users.nodes, two_users.out
    for node, chain in two_users.guards.items():
        assert chain in two_users.chains_running[node], (node, two_users.chains_running)
        assert chain not in two_users.chains_after[node], (node, two_users.chains_after)
    segment = two_users.segment
    assert segment is not None and segment.attacker_chain in segment.chains
    assert segment.attacker_chain not in two_users.chains_after[segment.node]


def test_the_other_users_guest_takes_no_address_or_mac_on_the_segment(two_users: TwoUsers) -> None:
    """The other user's guest, on the job VM's node and bridge, took the job VM's, the
    node's and the controller's addresses (ip addr, gratuitous ARP, ARP replies) and
    sent from the job VM's MAC, a forged one and the job VM's address. The node's and
    the controller's neighbour tables (their kernels' own views) and the node bridge's
    forwarding entry for the job VM's MAC are as they were, the job VM's MAC QEMU's own;
    the attacker's own traffic still flows."""
    segment = two_users.segment
    assert segment is not None and segment.up is not None, two_users.out
    assert segment.up.returncode == 0, segment.up.stderr
    attack = segment.attack
    assert attack is not None
    assert attack.returncode == 0, attack.stdout + attack.stderr
    assert segment.before["node: victim"] == segment.victim_mac
    assert segment.before["controller: victim"] == segment.victim_mac
    assert None not in segment.before.values(), segment.before
    assert segment.after == segment.before
    assert segment.fdb_before == segment.fdb_after == segment.victim_tap
    own = segment.own_ping
    assert own is not None
    assert own.returncode == 0, own.stdout + own.stderr


def test_the_admin_sees_the_attackers_frames_dropped_and_none_of_the_victims(
    two_users: TwoUsers,
) -> None:
    """nft's named counters in the node's guard table (read as root, the admin): the
    attacker's tap dropped frames for each reason (a MAC not its own, ARP and IPv4 from
    an address not its own); the job VM's tap dropped nothing."""
    segment = two_users.segment
    assert segment is not None and segment.attacker_chain and segment.victim_chain
    for reason in ("mac", "arp", "ip"):
        assert segment.drops[f"{segment.attacker_chain}_{reason}"] > 0, segment.drops
        assert segment.drops[f"{segment.victim_chain}_{reason}"] == 0, segment.drops
