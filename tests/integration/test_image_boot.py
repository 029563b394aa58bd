"""``hpcvm up --image``: a real Debian 12 disk image, booted under TCG, used, stopped.

The image is built by tests/image_builder.py (mmdebstrap from Debian's mirror, cached
per recipe; minutes the first time on a machine). It does not start qemu-guest-agent
by itself: only the NoCloud seed hpcvm attaches does, so reaching the agent at all shows
the seed works. The built-in guest runs the host's own Debian 12, so /etc/os-release
alone cannot tell the two apart: the tests also check what only the disk boot has (the
root on /dev/vda2, cloud-init's NoCloud datasource, the hostname and instance-id from
the seed, read back from the seed file with isoinfo, not from hpcvm).

Each test runs in its own runtime directory and ends by checking that nothing is left
(no QEMU, no run dir, hence no overlay or seed; tests/runtime_support.py), and that the
user's image was not written to.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hpcvm import procs
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine import state
from tests import image_builder
from tests.runtime_support import HPCVM, Residue, assert_nothing_left, hpcvm, one_line_error

pytestmark = pytest.mark.integration

UP_ARGS = ["--profile", "pinned", "--vcpus", "2", "--memory", "1G"]
BOOT_TIMEOUT = 1200.0  # a whole distribution under TCG on a shared 2-core machine
EXEC_TIMEOUT = 600.0


@pytest.fixture(scope="session")
def test_image() -> Path:
    missing = image_builder.missing_tools()
    if missing:
        pytest.fail(f"cannot build the test image, missing {missing}: run scripts/setup.sh")
    return image_builder.build_test_image()


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime root libvirt's QEMU user can pass through (not under pytest's 0700
    temporary directories): the disk overlay and seed live in the VM's run dir."""
    base = Path(tempfile.mkdtemp(prefix="hpcvm-image-test-", dir="/tmp"))
    base.chmod(0o711)
    root = base / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(root))
    monkeypatch.delenv("HPCVM_READY_TIMEOUT", raising=False)  # the disk image default
    before = Residue.take(root)
    try:
        yield root
        subprocess.run([HPCVM, "down", "--all", "--timeout", "20"], capture_output=True)
        assert_nothing_left(before)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def guest(name: str, *argv: str) -> str:
    done = hpcvm("exec", name, "--timeout", str(EXEC_TIMEOUT), "--", *argv,
                 timeout=EXEC_TIMEOUT + 60)  # fmt: skip
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


def seed_meta_data(seed: Path) -> dict[str, str]:
    text = subprocess.run(
        ["isoinfo", "-i", str(seed), "-J", "-x", "/meta-data"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    meta = yaml.safe_load(text)
    assert isinstance(meta, dict)
    return meta


@pytest.mark.parametrize("backend", ["qemu", "libvirt"])
def test_up_exec_verify_down_from_a_disk_image(
    runtime: Path, test_image: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    extra: list[str] = ["--backend", backend]
    if backend == "libvirt":
        extra += ["--connect", request.getfixturevalue("libvirtd")]
    image_stat = test_image.stat()

    up = hpcvm("up", "--name", "img1", *UP_ARGS, "--image", str(test_image), *extra,
               timeout=BOOT_TIMEOUT)  # fmt: skip
    assert up.returncode == 0, up.stderr
    machine = state.load_machine("img1")
    run_dir = Path(machine.run_dir)
    assert machine.image == str(test_image) and machine.backend == backend
    assert machine.boot.kernel is None and machine.boot.shares == ()  # no --share given
    assert not machine.boot.share_table
    overlay, seed = Path(str(machine.boot.disk_image)), Path(str(machine.boot.seed_image))
    assert overlay.parent == run_dir and seed.parent == run_dir
    assert overlay.is_file() and seed.is_file()

    os_release = guest("img1", "cat", "/etc/os-release")
    assert 'VERSION_ID="12"' in os_release and "ID=debian" in os_release
    assert int(guest("img1", "nproc")) == 2
    # Booted from the disk, not the built-in guest (whose root is 9p + overlay):
    root = guest("img1", "findmnt", "-n", "-o", "SOURCE,FSTYPE", "/").split()
    assert root == ["/dev/vda2", "ext4"]
    # The seed was read by cloud-init: its datasource, hostname and instance-id.
    status = guest("img1", "cloud-init", "status", "--wait", "--long")
    assert "status: done" in status and "NoCloud" in status, status
    meta = seed_meta_data(seed)
    assert guest("img1", "hostname").strip() == meta["local-hostname"] == "img1"
    instance = guest("img1", "cat", "/var/lib/cloud/data/instance-id").strip()
    assert instance == meta["instance-id"]

    verify = hpcvm("verify", "img1", "--json", timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["checks"] and all(c["ok"] for c in report["checks"])

    down = hpcvm("down", "img1", timeout=300)
    assert down.returncode == 0, down.stderr
    assert machine.pid is not None and not procs.pid_alive(machine.pid, reap=True)
    assert not run_dir.exists() and not overlay.exists() and not seed.exists()
    after = test_image.stat()
    assert (after.st_size, after.st_mtime_ns) == (image_stat.st_size, image_stat.st_mtime_ns)


def test_bad_images_are_refused_before_anything_starts(runtime: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake.qcow2"
    fake.write_text("not a disk image\n")
    cases = {
        "does not exist": str(tmp_path / "missing.qcow2"),
        "is a directory": str(tmp_path),
        "is not a qcow2 image": str(fake),
    }
    for words, image in cases.items():
        done = hpcvm("up", "--name", "bad", *UP_ARGS, "--image", image)
        assert done.returncode == 2, done.stderr
        assert words in one_line_error(done)
    both = hpcvm("up", "--name", "bad", *UP_ARGS, "--image", str(fake), "--kernel", str(fake))
    assert both.returncode == 2 and "not both" in one_line_error(both)
    assert not runtime.exists() or list(runtime.iterdir()) == []
