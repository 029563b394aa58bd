"""guest/disk.py with the real tools: qemu-img, genisoimage; read back independently.

The seed is read back with blkid (what cloud-init's ds-identify uses to find a
``cidata`` volume), isoinfo (a separate ISO9660 reader) and the raw Primary Volume
Descriptor bytes; user-data is parsed with PyYAML. Bad images are real files made with
qemu-img or written by the test. No VM is started.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.guest import disk

SECTOR = 512


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def bootable_raw(path: Path, size: int = 4 * 1024 * 1024) -> Path:
    """A raw disk whose first sector ends in the 55AA boot signature (no OS in it)."""
    with path.open("wb") as fh:
        fh.truncate(size)
        fh.seek(510)
        fh.write(b"\x55\xaa")
    return path


def bootable_qcow2(tmp_path: Path, name: str = "boot.qcow2") -> Path:
    raw = bootable_raw(tmp_path / "src.raw")
    out = tmp_path / name
    run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(out))
    return out


def iso_file(iso: Path, name: str) -> str:
    return run("isoinfo", "-i", str(iso), "-J", "-x", f"/{name}")


def assert_one_line_usage(exc: pytest.ExceptionInfo[UsageError], *words: str) -> None:
    message = str(exc.value)
    assert "\n" not in message and message
    for word in words:
        assert word in message, message


# -- the seed -----------------------------------------------------------------------------


def test_seed_is_an_iso_labelled_cidata_with_both_files(tmp_path: Path) -> None:
    seed = disk.make_seed(tmp_path, name="img1", instance_id="iid-test-1")
    assert seed == tmp_path / disk.SEED_NAME
    assert run("blkid", "-o", "value", "-s", "TYPE", str(seed)).strip() == "iso9660"
    assert run("blkid", "-o", "value", "-s", "LABEL", str(seed)).strip() == "cidata"
    pvd = seed.read_bytes()[16 * 2048 : 17 * 2048]  # ISO9660 Primary Volume Descriptor
    assert pvd[1:6] == b"CD001" and pvd[40:72].rstrip(b" ") == b"cidata"
    listing = run("isoinfo", "-i", str(seed), "-J", "-f").split()
    assert sorted(listing) == ["/meta-data", "/user-data"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [disk.SEED_NAME]  # no staging left
    assert stat.S_IMODE(seed.stat().st_mode) == 0o600


def test_seed_meta_data_names_the_instance_and_host(tmp_path: Path) -> None:
    seed = disk.make_seed(tmp_path, name="my_vm", instance_id="iid-test-2")
    meta = yaml.safe_load(iso_file(seed, "meta-data"))
    assert meta == {"instance-id": "iid-test-2", "local-hostname": "my-vm"}


def test_seed_hostname_that_looks_like_a_number_stays_a_string(tmp_path: Path) -> None:
    seed = disk.make_seed(tmp_path, name="1e3")
    meta = yaml.safe_load(iso_file(seed, "meta-data"))
    assert meta["local-hostname"] == "1e3"
    assert meta["instance-id"].startswith("hpcvm-1e3-")


def test_each_seed_is_a_new_instance(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ids = {
        yaml.safe_load(iso_file(disk.make_seed(tmp_path / d, name="x"), "meta-data"))["instance-id"]
        for d in ("a", "b")
    }
    assert len(ids) == 2


def test_seed_user_data_is_cloud_config_that_starts_the_agent(tmp_path: Path) -> None:
    seed = disk.make_seed(tmp_path, name="img1")
    text = iso_file(seed, "user-data")
    assert text.splitlines()[0] == "#cloud-config"
    config = yaml.safe_load(text)
    (command,) = config["bootcmd"]
    assert command[:2] == ["sh", "-c"]
    script = command[2]
    assert disk.DISK_AGENT_PORT in script and "qemu-ga" in script
    assert "systemd-run --no-block" in script  # blocking would deadlock (see disk.py)
    subprocess.run(["sh", "-n", "-c", script], check=True)  # valid shell
    # Nothing from the network: no packages, no update or upgrade.
    assert "packages" not in config
    assert config["package_update"] is False and config["package_upgrade"] is False


def test_agent_script_finds_its_port_by_name_in_sysfs(tmp_path: Path) -> None:
    """The bootcmd script run against a fake /sys/class/virtio-ports and fake systemctl,
    systemd-run and qemu-ga on PATH (a real guest's sysfs and systemd cannot exist in
    a unit test): it must start the agent on the vport whose name is hpcvm's port."""
    ports = tmp_path / "sys"
    for vport, name in (("vport1p1", "org.qemu.guest_agent.0"), ("vport2p1", "other"),
                        ("vport3p1", disk.DISK_AGENT_PORT)):  # fmt: skip
        (ports / vport).mkdir(parents=True)
        (ports / vport / "name").write_text(name + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for tool, code in (("systemctl", 3), ("systemd-run", 0), ("qemu-ga", 0)):
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit {code}\n')
        script.chmod(0o755)
    text = yaml.safe_load(disk.user_data("x"))["bootcmd"][0][2]
    text = text.replace("/sys/class/virtio-ports", str(ports))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    subprocess.run(["sh", "-c", text], check=True, env=env)
    lines = calls.read_text().splitlines()
    assert lines[0] == "systemctl is-active --quiet hpcvm-guest-agent"
    assert lines[1] == (
        "systemd-run --no-block --unit=hpcvm-guest-agent -p Restart=always -p RestartSec=1 "
        f"{bin_dir / 'qemu-ga'} --method=virtio-serial --path=/dev/vport3p1"
    )
    assert len(lines) == 2


def test_bad_agent_port_name_is_refused() -> None:
    with pytest.raises(UsageError):
        disk.user_data("x", agent_port="a; rm -rf /")


# -- checking images ----------------------------------------------------------------------


def test_missing_image_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as exc:
        disk.check_image(tmp_path / "nope.qcow2")
    assert_one_line_usage(exc, "does not exist", "nope.qcow2", "--image")


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as exc:
        disk.check_image(tmp_path)
    assert_one_line_usage(exc, "is a directory")


def test_text_file_named_qcow2_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "fake.qcow2"
    fake.write_text("I am not a disk image\n" * 100)
    with pytest.raises(UsageError) as exc:
        disk.check_image(fake)
    assert_one_line_usage(exc, "not a qcow2 image", "raw")


def test_raw_file_without_boot_sector_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.img"
    text.write_text("plain text, no boot sector\n" * 100)
    with pytest.raises(UsageError) as exc:
        disk.check_image(text)
    assert_one_line_usage(exc, "no boot sector")


def test_empty_qcow2_is_refused(tmp_path: Path) -> None:
    blank = tmp_path / "blank.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", str(blank), "16M")
    with pytest.raises(UsageError) as exc:
        disk.check_image(blank)
    assert_one_line_usage(exc, "no boot sector")


def test_other_formats_are_refused_with_the_conversion(tmp_path: Path) -> None:
    vmdk = tmp_path / "disk.vmdk"
    run("qemu-img", "convert", "-f", "raw", "-O", "vmdk",
        str(bootable_raw(tmp_path / "b.raw")), str(vmdk))  # fmt: skip
    with pytest.raises(UsageError) as exc:
        disk.check_image(vmdk)
    assert_one_line_usage(exc, "is vmdk", "qemu-img convert -O qcow2")


def test_corrupt_qcow2_is_refused(tmp_path: Path) -> None:
    good = bootable_qcow2(tmp_path)
    broken = tmp_path / "broken.qcow2"
    data = bytearray(good.read_bytes())
    data[4:8] = (99).to_bytes(4, "big")  # an unknown qcow2 version
    broken.write_bytes(bytes(data))
    with pytest.raises(UsageError) as exc:
        disk.check_image(broken)
    assert_one_line_usage(exc, "cannot be used")


def test_qcow2_with_missing_backing_file_is_refused(tmp_path: Path) -> None:
    base = bootable_qcow2(tmp_path, "base.qcow2")
    top = tmp_path / "top.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(top))
    base.unlink()
    with pytest.raises(UsageError) as exc:
        disk.check_image(top)
    assert_one_line_usage(exc, "cannot be used", "base.qcow2")


def _points_to(fd: Path, target: Path) -> bool:
    try:
        return Path(os.readlink(fd)) == target
    except OSError:
        return False


def test_qcow2_another_process_writes_is_refused(tmp_path: Path) -> None:
    """qemu-io stands in for a VM writing the image: it takes QEMU's image locks."""
    image = bootable_qcow2(tmp_path)
    writer = subprocess.Popen(["qemu-io", "-f", "qcow2", "-c", "sleep 600000", str(image)])
    try:
        deadline = time.monotonic() + 120
        # Wait until qemu-io has opened (and so locked) the image before probing: a probe
        # that opens it first would make qemu-io fail to take its write lock.
        fds = Path(f"/proc/{writer.pid}/fd")
        while not any(_points_to(fd, image) for fd in fds.iterdir()):
            assert writer.poll() is None and time.monotonic() < deadline, "qemu-io never opened"
            time.sleep(0.05)
        while True:  # until check_image sees the lock (the machine may be slow)
            try:
                disk.check_image(image)
            except UsageError as exc:
                assert_one_line_usage(pytest.ExceptionInfo.from_exc_info(
                    (UsageError, exc, exc.__traceback__)), "lock", "another VM")  # fmt: skip
                break
            assert writer.poll() is None and time.monotonic() < deadline, "never locked"
            time.sleep(0.2)
    finally:
        writer.kill()
        writer.wait()
    assert disk.check_image(image).format == "qcow2"  # free again


def test_bootable_images_are_accepted_with_their_format(tmp_path: Path) -> None:
    qcow2 = bootable_qcow2(tmp_path)
    info = disk.check_image(qcow2)
    assert (info.path, info.format, info.virtual_size) == (qcow2, "qcow2", 4 * 1024 * 1024)
    raw = disk.check_image(bootable_raw(tmp_path / "disk.img", 8 * 1024 * 1024))
    assert (raw.format, raw.virtual_size) == ("raw", 8 * 1024 * 1024)


# -- overlay and disk_boot ----------------------------------------------------------------


def test_overlay_keeps_the_users_image_unchanged(tmp_path: Path) -> None:
    base = bootable_raw(tmp_path / "user.img")
    digest = hashlib.sha256(base.read_bytes()).hexdigest()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    overlay = disk.make_overlay(disk.check_image(base), run_dir)
    info = json.loads(run("qemu-img", "info", "--output=json", str(overlay)))
    assert info["format"] == "qcow2"
    assert info["backing-filename"] == str(base)
    assert info["backing-filename-format"] == "raw"
    run("qemu-io", "-f", "qcow2", "-c", "write -P 0xab 0 64k", str(overlay))
    written = run("qemu-io", "-f", "qcow2", "-c", "read -P 0xab 0 64k", str(overlay))
    assert "read 65536/65536" in written
    assert hashlib.sha256(base.read_bytes()).hexdigest() == digest


def test_disk_boot_makes_overlay_and_seed_in_the_run_dir(tmp_path: Path) -> None:
    image = bootable_qcow2(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    made = disk.disk_boot(image, run_dir, name="img1")
    assert made.disk_image.parent == run_dir and made.seed_image.parent == run_dir
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([disk.OVERLAY_NAME, disk.SEED_NAME])
    assert made.base.path == image
    for f in (made.disk_image, made.seed_image):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600


def test_disk_boot_of_a_bad_image_leaves_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fake = tmp_path / "fake.qcow2"
    fake.write_text("nope\n")
    with pytest.raises(UsageError):
        disk.disk_boot(fake, run_dir, name="img1")
    assert list(run_dir.iterdir()) == []


def test_disk_boot_removes_the_overlay_when_the_seed_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """genisoimage made unavailable (PATH without it) to reach the seed's failure path."""
    image = bootable_qcow2(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    real_which = disk.shutil.which
    monkeypatch.setattr(
        disk.shutil, "which", lambda n: None if n == "genisoimage" else real_which(n)
    )
    with pytest.raises(RuntimeFailure) as exc:
        disk.disk_boot(image, run_dir, name="img1")
    assert "genisoimage not found" in str(exc.value)
    assert list(run_dir.iterdir()) == []
