"""A checkpoint directory: written all at once or not at all, read back only intact.

Real files in a temporary directory; the state file here is random bytes standing in
for QEMU's migration stream (the integration tests save real ones): what is tested is
the directory's integrity, which does not depend on what the bytes mean. The oracle for
a checksum is ``sha256sum``, not hashlib.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from hpcvm.bootspec import BootSpec
from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.host import discover
from hpcvm.plan import plan
from hpcvm.plan.model import CpuModel, PlanRequest, VMPlan
from hpcvm.runtime.checkpoint import directory as checkpoint_dir
from hpcvm.runtime.checkpoint import save_restore as checkpoint
from hpcvm.runtime.checkpoint.model import (
    DISK_FILE,
    MANIFEST,
    PLAN_FILE,
    STATE_FILE,
    BaseImage,
    Emulator,
    Manifest,
    guest_abi,
)
from hpcvm.runtime.machine.options import VmOptions
from hpcvm.units import MIB
from tests.conftest import TOPOLOGIES
from tests.plan_checks import roomy

BOOT = BootSpec(disk_image="/run/old/disk.qcow2", seed_image="/run/old/seed.iso")
EMULATOR = Emulator(version="7.2.22", package="Debian 1:7.2", machine_type="pc-q35-7.2")


@pytest.fixture(scope="module")
def saved_plan() -> VMPlan:
    host = roomy(discover(xml=TOPOLOGIES / "xml" / "24em64t-2n6c2t-pci.xml"))
    return plan(host, PlanRequest(profile="numa", vcpus=2, memory_bytes=512 * MIB, accel="tcg"))


def write(target: Path, vm_plan: VMPlan, state: bytes = b"") -> Path:
    """A checkpoint as ``checkpoint.save`` lays it out (plan, state, disk, manifest)."""
    with checkpoint_dir.writing(target) as writer:
        writer.write_text(PLAN_FILE, vm_plan.model_dump_json(indent=2))
        writer.path(STATE_FILE).write_bytes(state or os.urandom(300_000))
        writer.written(STATE_FILE)
        disk = target.parent / "overlay-source"
        disk.write_bytes(os.urandom(70_000))
        writer.copy_in(DISK_FILE, disk)
        manifest = Manifest(
            name="vm",
            saved_at=1.0,
            hostname="h",
            backend="qemu",
            emulator=EMULATOR,
            abi=guest_abi(vm_plan, BOOT),
            options=VmOptions(image="/img.qcow2"),
            boot=BOOT,
            files={},
        )
        return checkpoint_dir.commit(writer, manifest, target)


def sha256sum(path: Path) -> str:
    return subprocess.run(["sha256sum", str(path)], capture_output=True, text=True,
                          check=True).stdout.split()[0]  # fmt: skip


def test_round_trip_records_each_file_with_its_hash(tmp_path: Path, saved_plan: VMPlan) -> None:
    target = write(tmp_path / "ck", saved_plan)
    loaded = checkpoint_dir.load(target)
    assert loaded.plan == saved_plan
    files = loaded.manifest.files
    assert set(files) == {PLAN_FILE, STATE_FILE, DISK_FILE}
    for name, entry in files.items():
        assert entry.sha256 == sha256sum(target / name)
        assert entry.size == (target / name).stat().st_size
    assert sorted(p.name for p in target.iterdir()) == sorted([*files, MANIFEST])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial
    written_here = (PLAN_FILE, DISK_FILE, MANIFEST)  # (the state file is QEMU's to write)
    assert {oct((target / n).stat().st_mode & 0o777) for n in written_here} == {"0o600"}


def test_a_failure_while_writing_leaves_no_directory(tmp_path: Path, saved_plan: VMPlan) -> None:
    with pytest.raises(RuntimeError), checkpoint_dir.writing(tmp_path / "ck") as writer:
        writer.write_text(PLAN_FILE, saved_plan.model_dump_json())
        raise RuntimeError("the disk filled up")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_never_written_over(tmp_path: Path, saved_plan: VMPlan) -> None:
    (tmp_path / "ck").mkdir()
    with pytest.raises(UsageError, match="already exists"):
        write(tmp_path / "ck", saved_plan)
    assert list((tmp_path / "ck").iterdir()) == []


def test_a_truncated_state_file_is_refused(tmp_path: Path, saved_plan: VMPlan) -> None:
    target = write(tmp_path / "ck", saved_plan)
    with open(target / STATE_FILE, "r+b") as fh:
        fh.truncate(1000)
    with pytest.raises(UsageError) as refused:
        checkpoint_dir.load(target)
    assert f"{STATE_FILE}: 1000 bytes where 300000 were saved (truncated)" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_flipped_byte_is_refused(tmp_path: Path, saved_plan: VMPlan) -> None:
    target = write(tmp_path / "ck", saved_plan)
    data = bytearray((target / DISK_FILE).read_bytes())
    data[12345] ^= 0xFF
    (target / DISK_FILE).write_bytes(bytes(data))
    with pytest.raises(UsageError, match=f"{DISK_FILE}: its SHA-256 differs"):
        checkpoint_dir.load(target)


def test_a_changed_plan_is_refused(tmp_path: Path, saved_plan: VMPlan) -> None:
    target = write(tmp_path / "ck", saved_plan)
    changed = saved_plan.model_copy(update={"vcpus": 4})
    (target / PLAN_FILE).write_text(changed.model_dump_json(indent=2))
    with pytest.raises(UsageError, match=f"{PLAN_FILE}: .* (SHA-256|bytes)"):
        checkpoint_dir.load(target)


def test_a_changed_plan_with_a_forged_checksum_still_is_refused(
    tmp_path: Path, saved_plan: VMPlan
) -> None:
    """The plan must describe the guest the manifest recorded, whatever its hash."""
    target = write(tmp_path / "ck", saved_plan)
    for changed, reason in [
        (saved_plan.model_copy(update={"cpu": CpuModel(model="max")}), "CPU model: saved qemu64"),
        (saved_plan.model_copy(update={"vcpus": 3}), "cannot be rendered"),
    ]:
        forge(target, changed)
        with pytest.raises(UsageError, match=f"{PLAN_FILE}: .*{reason}") as refused:
            checkpoint_dir.load(target)
        assert "is damaged" in str(refused.value)


def forge(target: Path, changed: VMPlan) -> None:
    """Write another plan and make the manifest's checksum agree with it."""
    text = changed.model_dump_json(indent=2)
    (target / PLAN_FILE).write_text(text)
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["files"][PLAN_FILE] = {"size": len(text), "sha256": sha256sum(target / PLAN_FILE)}
    (target / MANIFEST).write_text(json.dumps(manifest))


def test_a_directory_without_manifest_is_incomplete(tmp_path: Path, saved_plan: VMPlan) -> None:
    target = write(tmp_path / "ck", saved_plan)
    (target / MANIFEST).unlink()
    with pytest.raises(UsageError, match=r"is incomplete: it has no manifest\.json"):
        checkpoint_dir.load(target)


def test_a_missing_file_is_refused(tmp_path: Path, saved_plan: VMPlan) -> None:
    target = write(tmp_path / "ck", saved_plan)
    (target / DISK_FILE).unlink()
    with pytest.raises(UsageError, match=f"{DISK_FILE}: it is missing"):
        checkpoint_dir.load(target)


def test_another_schema_version_says_which(tmp_path: Path, saved_plan: VMPlan) -> None:
    target = write(tmp_path / "ck", saved_plan)
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["schema_version"] = 99
    (target / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="schema version 99; this hpcvm reads version 1"):
        checkpoint_dir.load(target)


def test_no_checkpoint_at_all(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        checkpoint_dir.load(tmp_path / "nothing")


def test_another_qemu_is_refused_and_another_build_warned(
    tmp_path: Path, saved_plan: VMPlan
) -> None:
    loaded = checkpoint_dir.load(write(tmp_path / "ck", saved_plan))
    newer = EMULATOR.model_copy(update={"version": "8.0.0", "machine_type": "pc-q35-8.0"})
    with pytest.raises(InfeasiblePlanError, match=r"saved by QEMU 7\.2\.22 .*here QEMU is 8\.0"):
        checkpoint.check_emulator(loaded, newer)
    other_machine = EMULATOR.model_copy(update={"machine_type": "pc-q35-7.1"})
    with pytest.raises(InfeasiblePlanError, match=r"machine pc-q35-7\.1"):
        checkpoint.check_emulator(loaded, other_machine)
    warnings: list[str] = []
    rebuilt = EMULATOR.model_copy(update={"package": "Debian 1:7.2 rebuilt"})
    checkpoint.check_emulator(loaded, rebuilt, warnings.append)
    assert len(warnings) == 1 and "rebuilt" in warnings[0]


def test_the_image_under_the_overlay_must_be_the_one_saved_over(
    tmp_path: Path, saved_plan: VMPlan
) -> None:
    image = tmp_path / "base.qcow2"
    image.write_bytes(b"\0" * 4096)
    info = image.stat()
    loaded = checkpoint_dir.load(write(tmp_path / "ck", saved_plan))
    base = BaseImage(path=str(image), size=info.st_size, mtime_ns=info.st_mtime_ns)
    with_base = replace(loaded, manifest=loaded.manifest.model_copy(update={"base_image": base}))
    checkpoint.check_base_image(with_base)  # unchanged: accepted
    with image.open("ab") as fh:
        fh.write(b"written by someone since")
    with pytest.raises(UsageError, match="changed since checkpoint"):
        checkpoint.check_base_image(with_base)
    image.unlink()
    with pytest.raises(UsageError, match="is not there"):
        checkpoint.check_base_image(with_base)
