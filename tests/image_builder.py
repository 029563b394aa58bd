"""Build a small bootable Debian 12 disk image for the ``--image`` tests, and cache it.

The tests must boot a real user-style disk image, and nothing may be downloaded but
distribution packages: so the image is made here with mmdebstrap from Debian's mirror.
It holds linux-image-amd64, systemd, udev, qemu-guest-agent and cloud-init (and for the
cluster tests Open MPI, openssh-server, iproute2, arping and tests/cluster/mpi_ring.c
built with the host's mpicc), booted by
SYSLINUX from a FAT partition (kernel + initrd + syslinux.cfg) with the root on an ext4
partition. Run as ``python -m tests.image_builder [CACHE_DIR]`` to build it by hand.

No loop device and no mount is needed (they are shared or refused in containers): the
FAT file system is made inside the raw disk file with ``mkfs.vfat --offset`` and filled
with mtools, SYSLINUX is installed into it with ``syslinux --offset`` (which works on
an unmounted file), the ext4 root is written into its partition with ``mkfs.ext4 -d``
(populated from the mmdebstrap directory, ``-E offset``), SYSLINUX's MBR code goes into
the first 440 bytes, and ``qemu-img convert`` makes the qcow2.

On purpose, the image does NOT start qemu-guest-agent by itself: Debian's udev rule
that pulls the agent in when the virtio port appears is overridden by one that only tags
the device for systemd. The agent then runs only if the NoCloud seed hpcvm attaches
starts it, so a test that reaches the agent proves the seed works (and would fail
without it). cloud-init is restricted to the NoCloud datasource so it does not spend
minutes probing cloud metadata servers on a guest that has no network.

The result is cached under ``$HPCVM_TEST_IMAGE_CACHE`` or /var/cache/hpcvm/test-images,
in a directory named by a hash of the recipe below: changing the recipe builds a new
image, and a machine builds each recipe once. A lock file serialises concurrent builds.
Measured on this 2-core machine: 213-411 s for a build (mostly mmdebstrap, depending on
the load from others), a 282 MiB qcow2 (2 GiB virtual,
compressed); each step's time is in build.log beside the image. Booting it under TCG
to the agent's first answer: 60-80 s.

"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ENV_CACHE = "HPCVM_TEST_IMAGE_CACHE"
DEFAULT_CACHE = Path("/var/cache/hpcvm/test-images")
IMAGE_NAME = "debian12.qcow2"
TOOLS = ("mmdebstrap", "mkfs.vfat", "mkfs.ext4", "mcopy", "syslinux", "sfdisk", "qemu-img", "mpicc")
SYSLINUX_MBR = Path("/usr/lib/syslinux/mbr/mbr.bin")
MPI_RING = Path(__file__).resolve().parent / "cluster" / "mpi_ring.c"
MIB = 1024 * 1024
SECTOR = 512

RECIPE: dict[str, object] = {
    "version": 5,  # bump when the build steps change in a way the fields do not show
    "suite": "bookworm",
    "mirror": "http://deb.debian.org/debian",
    "variant": "minbase",
    "include": [
        "linux-image-amd64",
        "systemd-sysv",
        "udev",
        "qemu-guest-agent",
        "cloud-init",
        # for cluster guests (cluster up --image): MPI ranks start over ssh, and the
        # guest's address is set with ip (tests/integration/test_cluster_checkpoint.py)
        "openmpi-bin",
        "openssh-server",
        "iproute2",
        "iputils-arping",
    ],
    "boot_mib": 96,  # FAT: kernel (~8 MiB) + initrd (~30 MiB) + SYSLINUX
    "root_mib": 2048,  # ext4, sparse in the qcow2
    "cmdline": "ro console=ttyS0,115200 net.ifnames=0",
    # MPI programs built here with mpicc (the host's Open MPI is Debian 12's, as the
    # image's) and put in the image: a job checkpoint's guests cannot reach the host's
    # files (a mounted 9p share blocks a checkpoint)
    "programs": {"/usr/local/bin/mpi_ring": hashlib.sha256(MPI_RING.read_bytes()).hexdigest()},
}

# The guest's udev rule for the agent port, minus SYSTEMD_WANTS (see module docstring).
_AGENT_UDEV_RULE = (
    'SUBSYSTEM=="virtio-ports", ATTR{name}=="org.qemu.guest_agent.0", TAG+="systemd"\n'
)
# NoCloud only (no minutes of probing metadata servers without a network); no locale
# module (minbase has no `locales`, so cloud-init's update-locale would fail); an ed25519
# host key only: cloud-init makes the image's host keys on each new instance, and RSA
# 3072, DSA and ECDSA took 11 s of a 41 s boot to the agent under TCG (the agent's unit
# starts after cloud-init.service). hpcvm's cluster sshd brings its own key.
_CLOUD_CFG = "datasource_list: [ NoCloud, None ]\nlocale: false\nssh_genkeytypes: [ ed25519 ]\n"


def recipe_key(recipe: dict[str, object] | None = None) -> str:
    """A short hash of the recipe: the cache directory's name."""
    text = json.dumps(recipe or RECIPE, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get(ENV_CACHE) or DEFAULT_CACHE)


def cached_image(cache_dir: Path | None = None) -> Path:
    """Where the image for the current recipe is (or will be) cached."""
    return (cache_dir or cache_root()) / recipe_key() / IMAGE_NAME


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def build_test_image(cache_dir: Path | None = None, *, log: Path | None = None) -> Path:
    """The cached qcow2 for RECIPE, built first if it is not there (needs root)."""
    target = cached_image(cache_dir)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / "build.lock"):
        if target.is_file():  # another process built it while we waited
            return target
        work = Path(tempfile.mkdtemp(prefix="build.", dir=target.parent))
        try:
            log_path = log or target.parent / "build.log"
            with log_path.open("w") as log_file:
                started = time.monotonic()
                qcow2 = _build(work, log_file)
                log_file.write(f"built in {time.monotonic() - started:.0f} s\n")
            os.replace(qcow2, target)
        finally:
            _remove_build_dir(work)
    return target


def _remove_build_dir(work: Path) -> None:
    """Remove the build directory, never through a mount: an interrupted mmdebstrap can
    leave /proc, /sys, /dev/pts mounted inside the root; unmount those first."""
    prefix = f"{work}/"
    mounts = [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefix)
    ]
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False, capture_output=True)
    still = [line for line in Path("/proc/mounts").read_text().splitlines() if prefix in line]
    if still:
        print(f"image_builder: {work} still has mounts; not removing it", file=sys.stderr)
        return
    shutil.rmtree(work, ignore_errors=True)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(argv: Sequence[str], log: object, **kwargs: object) -> None:
    """Run a build step, its output into the build log; fail with the log's tail."""
    assert hasattr(log, "write")
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()  # type: ignore[attr-defined]
    started = time.monotonic()
    proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False, **kwargs)  # type: ignore[call-overload]
    log.write(f"({time.monotonic() - started:.1f} s)\n")
    if proc.returncode != 0:
        raise RuntimeError(f"image build step failed ({proc.returncode}): {' '.join(argv)}")


def _build(work: Path, log: object) -> Path:
    root = work / "root"
    _bootstrap(root, log)
    root_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"hpcvm-test-image-{recipe_key()}"))
    _configure(root, root_uuid)
    raw = work / "disk.raw"
    _make_disk(raw, root, root_uuid, log)
    qcow2 = work / IMAGE_NAME
    # Compressed: kernel modules are most of the root and shrink well; the image is only
    # ever read (VMs write to their overlays), so compression costs no write speed.
    _run(["qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)], log)
    return qcow2


def _bootstrap(root: Path, log: object) -> None:
    """mmdebstrap rather than debootstrap: it resolves --include with apt (debootstrap's
    own resolver left python3-cryptography unconfigurable here), and it drops docs,
    man pages and locales as it unpacks."""
    include = ",".join(RECIPE["include"])  # type: ignore[arg-type]
    _run(
        [
            "mmdebstrap",
            "--mode=root",
            f"--variant={RECIPE['variant']}",
            f"--include={include}",
            "--aptopt=APT::Install-Recommends false",
            *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale")),
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            str(RECIPE["suite"]),
            str(root),
            str(RECIPE["mirror"]),
        ],
        log,
    )


def _configure(root: Path, root_uuid: str) -> None:
    (root / "etc/fstab").write_text(f"UUID={root_uuid} / ext4 errors=remount-ro 0 1\n")
    (root / "etc/hostname").write_text("debian12-test\n")
    (root / "etc/udev/rules.d/60-qemu-guest-agent.rules").write_text(_AGENT_UDEV_RULE)
    (root / "etc/cloud/cloud.cfg.d/90-hpcvm-test.cfg").write_text(_CLOUD_CFG)
    # A fresh machine-id per boot (systemd makes one when the file is empty).
    (root / "etc/machine-id").write_text("")
    target = root / "usr/local/bin/mpi_ring"
    subprocess.run(["mpicc", "-O1", "-o", str(target), str(MPI_RING)], check=True)
    target.chmod(0o755)
    # The image's own sshd stays off: a cluster guest's sshd is started by hpcvm with
    # the job's keys (cluster/job/guest_mpi.py), on its address only.
    for unit in ("multi-user.target.wants/ssh.service", "sshd.service"):
        (root / "etc/systemd/system" / unit).unlink(missing_ok=True)


def _kernel_files(root: Path) -> tuple[Path, Path]:
    kernels = sorted((root / "boot").glob("vmlinuz-*"))
    initrds = sorted((root / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise RuntimeError(f"no kernel or initrd in {root / 'boot'}: linux-image-amd64 missing?")
    return kernels[-1], initrds[-1]


def _syslinux_cfg(root_uuid: str) -> str:
    return (
        "SERIAL 0 115200\n"
        "DEFAULT debian\n"
        "PROMPT 0\n"
        "TIMEOUT 0\n"
        "LABEL debian\n"
        "  LINUX /vmlinuz\n"
        "  INITRD /initrd.img\n"
        f"  APPEND root=UUID={root_uuid} {RECIPE['cmdline']}\n"
    )


def _make_disk(raw: Path, root: Path, root_uuid: str, log: object) -> None:
    """MBR disk: partition 1 FAT (bootable, SYSLINUX), partition 2 ext4 root."""
    boot_mib = int(RECIPE["boot_mib"])  # type: ignore[call-overload]
    root_mib = int(RECIPE["root_mib"])  # type: ignore[call-overload]
    boot_start = MIB // SECTOR  # 1 MiB aligned
    root_start = boot_start + boot_mib * MIB // SECTOR
    with raw.open("wb") as fh:
        fh.truncate((1 + boot_mib + root_mib) * MIB)
    layout = (
        "label: dos\n"
        f"start={boot_start}, size={boot_mib * MIB // SECTOR}, type=6, bootable\n"
        f"start={root_start}, size={root_mib * MIB // SECTOR}, type=83\n"
    )
    _run(["sfdisk", "--no-reread", "--no-tell-kernel", str(raw)], log, input=layout.encode())
    with raw.open("r+b") as fh, SYSLINUX_MBR.open("rb") as mbr:
        fh.write(mbr.read(440))  # boot code only: the partition table follows it
    _make_boot_fs(raw, root, root_uuid, boot_start, boot_mib, log)
    _run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            "root",
            "-U",
            root_uuid,
            "-d",
            str(root),
            "-E",
            f"offset={root_start * SECTOR}",
            str(raw),
            f"{root_mib}M",
        ],
        log,
    )


def _make_boot_fs(
    raw: Path, root: Path, root_uuid: str, start: int, size_mib: int, log: object
) -> None:
    kernel, initrd = _kernel_files(root)
    blocks = size_mib * 1024  # mkfs.vfat counts 1 KiB blocks
    _run(
        [
            "mkfs.vfat",
            "-F",
            "16",
            "-n",
            "BOOT",
            "-h",
            str(start),
            f"--offset={start}",
            str(raw),
            str(blocks),
        ],
        log,
    )
    image = f"{raw}@@{start * SECTOR}"  # mtools: file system at a byte offset
    cfg = raw.parent / "syslinux.cfg"
    cfg.write_text(_syslinux_cfg(root_uuid))
    env = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
    for source, name in ((kernel, "vmlinuz"), (initrd, "initrd.img"), (cfg, "syslinux.cfg")):
        _run(["mcopy", "-i", image, str(source), f"::/{name}"], log, env=env)
    _run(["syslinux", "--install", f"--offset={start * SECTOR}", str(raw)], log)


def main(argv: list[str]) -> int:
    missing = missing_tools()
    if missing:
        print(f"missing tools: {' '.join(missing)} (run scripts/setup.sh)", file=sys.stderr)
        return 1
    cache = Path(argv[1]) if len(argv) > 1 else None
    started = time.monotonic()
    image = build_test_image(cache)
    size = image.stat().st_size / MIB
    print(f"{image} ({size:.0f} MiB) ready after {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
