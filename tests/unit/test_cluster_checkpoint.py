"""A job checkpoint's directory read back (cluster/job/checkpoint_model.py), the phase
results of its steps (cluster/tasks/checkpoint_node.py), the choice of a detached command,
and the refusals of ``cluster up --restore`` and ``cluster checkpoint`` that need no
batch system: each one line, non-zero, nothing left behind. The whole job's checkpoint
and restore run under Slurm in tests/integration/test_cluster_checkpoint.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvm.cluster.batch.local import ENV_NODE
from hpcvm.cluster.commands import control, detached
from hpcvm.cluster.job import checkpoint_model
from hpcvm.cluster.job.checkpoint_model import DetachedExec, JobManifest, SavedVm
from hpcvm.cluster.job.spec import ClusterSpec
from hpcvm.cluster.job.state import ClusterRecord
from hpcvm.cluster.tasks import checkpoint_node
from hpcvm.errors import UsageError
from hpcvm.plan.model import PlanRequest
from hpcvm.runtime.machine.options import VmOptions

KEY = b"-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n"
PUB = b"ssh-ed25519 AAAA test\n"


def _spec() -> ClusterSpec:
    return ClusterSpec.model_validate(
        {
            "plan": PlanRequest(name="x", profile="pinned", vcpus=1, memory_bytes=1 << 29),
            "vm": VmOptions(image="/srv/guest.qcow2", network="bridge=br0"),
            "name": "job7",
            "first_address": "10.77.0.200/24",
            "workdir": "/home/u/run",
            "job_id": "7",
            "nodes": 2,
            "public_key": PUB.decode(),
        }
    )


def write_checkpoint(directory: Path, vms: int = 2) -> JobManifest:
    """A job checkpoint's own files as ``cluster checkpoint`` writes them (the VM
    directories empty: their files are runtime/checkpoint/directory.py's, tested there)."""
    directory.mkdir()
    (directory / "id_job").write_bytes(KEY)
    (directory / "id_job.pub").write_bytes(PUB)
    for index in range(vms):
        (directory / f"vm-{index}").mkdir()
    manifest = JobManifest(
        name="job7",
        job_id="7",
        saved_at=1.0,
        spec=_spec(),
        network="10.77.0.0/24",
        vcpus=1,
        vms=tuple(
            SavedVm(
                index=i,
                node=f"node{i + 1}",
                vm=f"job7-node{i + 1}",
                address=f"10.77.0.{200 + i}/24",
            )
            for i in range(vms)
        ),
        detached=(DetachedExec(pid=392, argv=("mpirun", "./ring"), started_at=2.0),),
        key_sha256={
            "id_job": hashlib.sha256(KEY).hexdigest(),
            "id_job.pub": hashlib.sha256(PUB).hexdigest(),
        },
        pause_seconds=1.5,
    )
    (directory / "job.json").write_text(manifest.model_dump_json())
    return manifest


def test_a_complete_checkpoint_reads_back_as_written(tmp_path: Path) -> None:
    written = write_checkpoint(tmp_path / "ck")
    assert checkpoint_model.read(tmp_path / "ck") == written


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: (d / "job.json").unlink(), "not a complete job checkpoint"),
        (lambda d: (d / "job.json").write_text("{cut"), "is damaged"),
        (lambda d: (d / "id_job").write_bytes(b"other"), "id_job is missing or changed"),
        (lambda d: (d / "id_job.pub").unlink(), "id_job.pub is missing or changed"),
        (lambda d: (d / "vm-1").rmdir(), "vm-1 (the VM of node node2) is missing"),
    ],
)
def test_a_damaged_or_incomplete_checkpoint_is_refused(
    tmp_path: Path, damage: object, expected: str
) -> None:
    write_checkpoint(tmp_path / "ck")
    damage(tmp_path / "ck")  # type: ignore[operator]
    with pytest.raises(UsageError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        checkpoint_model.read(tmp_path / "ck")


def test_another_schema_version_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ck")
    path = tmp_path / "ck" / "job.json"
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="schema version 99"):
        checkpoint_model.read(tmp_path / "ck")


def test_a_restore_asks_for_the_saved_vms_under_the_new_job(tmp_path: Path) -> None:
    saved = write_checkpoint(tmp_path / "ck")
    request = control.restore_request(tmp_path / "ck", "job9", "local", None, "/scratch")
    assert (request.name, request.batch, request.workdir) == ("job9", "local", "/scratch")
    assert request.plan == saved.spec.plan
    assert request.vm == saved.spec.vm
    assert request.first_address == saved.spec.first_address


def _record(*pids: int) -> ClusterRecord:
    return ClusterRecord(
        name="c",
        job_id="1",
        nodes=("n1",),
        holder_pid=1,
        network="10.0.0.0/24",
        vcpus=1,
        detached=tuple(DetachedExec(pid=p, argv=("prog", str(p)), started_at=0.0) for p in pids),
    )


def test_wait_picks_the_only_detached_command_or_the_one_named() -> None:
    assert detached._detached(_record(5), None).pid == 5
    assert detached._detached(_record(5, 6), 6).pid == 6
    with pytest.raises(
        UsageError, match=r"say which command; its detached commands: 5 \(prog 5\), 6"
    ):
        detached._detached(_record(5, 6), None)
    with pytest.raises(UsageError, match="no detached command 7; its detached commands: none"):
        detached._detached(_record(), 7)


def test_phase_results_are_read_through_srun_labels() -> None:
    ok = checkpoint_node.NodeResult(node="n1", ok=True, state_bytes=10)
    bad = checkpoint_node.NodeResult(node="n2", ok=False, message="no")
    text = f"0: {ok.line()}\nnoise\n1: {bad.line()}\n"
    assert checkpoint_node.parse_results(text) == [ok, bad]


def test_a_phase_task_on_a_node_without_a_vm_answers_not_ok(tmp_path: Path) -> None:
    """The task always prints its result and exits 0 (a failing task would make the
    batch system end the other nodes' saves)."""
    phase = checkpoint_node.Phase(
        action="check",
        batch="local",
        vms={"local1": checkpoint_node.NodeVm(vm="c-local1", index=0)},
        directory=str(tmp_path),
    )
    env = {**os.environ, ENV_NODE: "local7", "HPCVM_RUNTIME_DIR": str(tmp_path / "rt")}
    role = [sys.executable, "-m", "hpcvm.cluster.internal", "checkpoint-node"]
    done = subprocess.run(
        [*role, phase.model_dump_json()],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (result,) = checkpoint_node.parse_results(done.stdout)
    assert (result.node, result.ok) == ("local7", False)
    assert "node local7 has no VM of this job" in result.message


def _cli(*args: str, runtime: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCVM_RUNTIME_DIR": str(runtime)}
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "cluster", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def _one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "rror" in line]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_vm_options_with_restore_are_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ck")
    done = _cli("up", "--name", "c", "--batch", "local", "--restore", str(tmp_path / "ck"),
                "--vcpus", "2", "--memory", "1G", runtime=tmp_path / "rt")  # fmt: skip
    line = _one_error(done)
    assert "--vcpus, --memory cannot be given with --restore" in line
    assert not (tmp_path / "rt").exists() or not any((tmp_path / "rt").rglob("*.json"))


def test_a_new_cluster_still_needs_its_shape(tmp_path: Path) -> None:
    done = _cli("up", "--name", "c", "--batch", "local", "--vcpus", "1", "--memory", "1G",
                "--address", "10.0.0.2/24", runtime=tmp_path / "rt")  # fmt: skip
    assert done.returncode == 2
    assert "Missing option '--profile'" in done.stderr


def test_restore_from_a_directory_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = _cli("up", "--name", "c", "--batch", "local", "--restore", str(tmp_path / "empty"),
                runtime=tmp_path / "rt")  # fmt: skip
    assert "is not a complete job checkpoint (no job.json)" in _one_error(done)


def test_checkpoint_of_an_unknown_cluster_writes_nothing(tmp_path: Path) -> None:
    done = _cli("checkpoint", "ghost", str(tmp_path / "ck"), runtime=tmp_path / "rt")
    assert "no cluster named 'ghost'" in _one_error(done)
    assert not (tmp_path / "ck").exists()
    assert not list(tmp_path.glob(".ck.partial-*"))


def test_checkpoint_is_never_written_over_a_directory(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    done = _cli("checkpoint", "ghost", str(tmp_path / "ck"), runtime=tmp_path / "rt")
    assert "already exists: give a new directory" in _one_error(done)


def test_a_task_killed_on_one_node_is_named_as_that_nodes_failure() -> None:
    """srun ends every task of a step once one is killed: the node whose task died gets
    srun's own line about it, the other only the step's end (as srun 22.05 printed them
    when the fault suite killed node4's save task)."""
    from hpcvm.cluster.commands.checkpoint import _why_silent

    stderr = (
        "srun: error: node4: task 1: Killed\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=2.11\n"
        "srun: Force Terminated StepId=2.11\n"
    )
    assert _why_silent("node4", 143, stderr) == "step exit 143: srun: error: node4: task 1: Killed"
    assert _why_silent("node3", 143, stderr) == "step exit 143: srun: Force Terminated StepId=2.11"


def test_a_node_task_says_a_full_disk_in_the_systems_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = tmp_path / "vm-2" / "state.bin"

    def fails() -> checkpoint_node.NodeResult:
        raise OSError(28, os.strerror(28), str(where))

    assert checkpoint_node.report("node2", fails) == 0  # the answer is the line
    (result,) = checkpoint_node.parse_results(capsys.readouterr().out)
    assert not result.ok and result.message == f"{os.strerror(28)}: {where}"
