"""A user's disk image, booted instead of the built-in guest (``hpcvm up --image``).

Three steps, each for a reason:

- ``check_image``: refuse, before anything starts, what would only fail later as a guest
  that never answers: a missing or unreadable file, a directory, a format QEMU would
  misread (the renderers pick qcow2 by the ``.qcow2`` suffix, raw otherwise), a file
  another process is writing (qemu-img's lock), or a disk with no boot sector.
- ``make_overlay``: the VM boots a qcow2 overlay in its run directory, backed read-only
  by the user's image. The user's image is never changed (a benchmark VM starts from the
  same disk every time, and several VMs can boot one image at once), and ``down``
  discards the guest's writes with the run directory.
- ``make_seed``: a cloud-init NoCloud seed, an ISO9660 image labelled ``cidata`` with
  ``meta-data`` and ``user-data``, attached as a second, read-only disk. hpcvm talks to
  every guest through qemu-guest-agent, so the seed makes sure the agent runs; it
  installs nothing (hpcvm's guests have no network) and sets the hostname to the VM's
  name. The seed is made with genisoimage, the tool cloud-init's docs use for NoCloud.

The agent's virtio-serial port is hpcvm's own (DISK_AGENT_PORT), not the standard
``org.qemu.guest_agent.0``: libvirtd connects to a channel of that name itself, so hpcvm
could not reach the agent under ``--backend libvirt``. Distributions start their
packaged agent only on the standard port (a udev rule and a unit bound to that device),
so the seed starts qemu-ga on hpcvm's port itself, as a transient systemd unit, on every
boot. Both backends then boot an image the same way.

An image must already contain qemu-guest-agent and cloud-init for ``up`` to succeed.
A whole distribution boots much more slowly than the built-in guest (firmware,
bootloader, systemd, cloud-init; under TCG 30-90 s here), hence DISK_READY_TIMEOUT.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from hpcvm.errors import RuntimeFailure, UsageError

SUPPORTED_FORMATS = ("qcow2", "raw")
OVERLAY_NAME = "disk.qcow2"
SEED_NAME = "seed.iso"
SEED_LABEL = "cidata"
DISK_AGENT_PORT = "org.hpcvm.guest_agent.0"  # see the module docstring
AGENT_UNIT = "hpcvm-guest-agent"
BOOT_SIGNATURE = b"\x55\xaa"  # last two bytes of an MBR (also of GPT's protective MBR)
# Seconds from QEMU's start to the agent's first answer for a disk image, per accel:
# generous, because TCG on a busy 2-core host can take minutes to reach cloud-init.
DISK_READY_TIMEOUT = {"tcg": 300.0, "kvm": 120.0}
_TOOL_TIMEOUT = 60.0
_PORT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # goes into a shell script unquoted


@dataclass(frozen=True)
class ImageInfo:
    """What ``qemu-img info`` says about a user's image."""

    path: Path  # absolute
    format: str  # qcow2 or raw
    virtual_size: int  # bytes the guest sees


@dataclass(frozen=True)
class DiskBoot:
    """What BootSpec needs to boot a disk image; both files live in the run dir."""

    disk_image: Path  # the overlay (qcow2) over the user's image
    seed_image: Path  # the NoCloud seed (ISO9660, label cidata)
    base: ImageInfo  # the user's image


# -- checking -----------------------------------------------------------------------------


def check_image(image: str | Path) -> ImageInfo:
    """The user's image, or a UsageError whose one line says what is wrong with it."""
    path = Path(image).expanduser().absolute()
    _check_file(path)
    info = _qemu_img_info(path)
    if info.format not in SUPPORTED_FORMATS:
        raise UsageError(
            f"disk image {path} is {info.format}; hpcvm boots qcow2 or raw: convert it with "
            f"`qemu-img convert -O qcow2 {path} {path.with_suffix('.qcow2')}`"
        )
    if path.suffix.lower() == ".qcow2" and info.format != "qcow2":
        raise UsageError(
            f"disk image {path} is named .qcow2 but is not a qcow2 image (qemu-img reads "
            f"it as {info.format}): check that --image names the right file"
        )
    if _first_sector(info)[510:512] != BOOT_SIGNATURE:
        raise UsageError(
            f"disk image {path} has no boot sector (no 55AA signature in its first sector), "
            "so it cannot boot: give --image a disk with an installed system"
        )
    return info


def _check_file(path: Path) -> None:
    """One stat: a path under a directory this user may not enter is said as such, not
    as a missing image (``Path.exists`` raises PermissionError there on Python 3.11)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"disk image {path} does not exist: check --image") from None
    except OSError as exc:
        raise UsageError(
            f"disk image {path} cannot be reached ({os.strerror(exc.errno or 0)}): give "
            "--image an image file you may read"
        ) from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"disk image {path} is a directory: give --image the image file")
    if not stat.S_ISREG(mode):
        raise UsageError(f"disk image {path} is not a regular file: give --image an image file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise UsageError(
            f"disk image {path} is not readable ({exc.strerror}): fix its mode, or give "
            "--image an image file you may read"
        ) from exc


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        package = "genisoimage" if name == "genisoimage" else "qemu-utils"
        raise RuntimeFailure(f"{name} not found: install {package} (scripts/setup.sh does)")
    return found


def _run_tool(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """Run a helper tool; its failure is returned, not raised (callers word the error)."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=_TOOL_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeFailure(f"{what} did not finish within {_TOOL_TIMEOUT:.0f} s") from exc


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no message"


def _unusable(path: Path, stderr: str) -> UsageError:
    """qemu-img's refusal as one line; a lock conflict says who to look for."""
    reason = _first_line(stderr).removeprefix("qemu-img: ")
    if "lock" in reason:
        reason += " (another VM or program is writing it: stop it or give a copy)"
    return UsageError(f"disk image {path} cannot be used: {reason}")


def _qemu_img_info(path: Path) -> ImageInfo:
    """qemu-img's view of the file, which is what QEMU will see. Without ``-U``: an
    image another process is writing is refused (its lock), not silently shared."""
    argv = [_tool("qemu-img"), "info", "--output=json", "--", str(path)]
    proc = _run_tool(argv, f"qemu-img info {path}")
    if proc.returncode != 0:
        raise _unusable(path, proc.stderr)
    try:
        data = json.loads(proc.stdout)
        return ImageInfo(
            path=path, format=str(data["format"]), virtual_size=int(data["virtual-size"])
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeFailure(f"qemu-img info {path} printed something unexpected: {exc}") from exc


def _first_sector(info: ImageInfo) -> bytes:
    """The first 512 bytes the guest would read (through qcow2 if need be)."""
    if info.format == "raw":
        with info.path.open("rb") as fh:
            return fh.read(512)
    with tempfile.TemporaryDirectory(prefix="hpcvm-sector.") as tmp:
        out = Path(tmp) / "sector0"
        argv = [_tool("qemu-img"), "dd", "-f", info.format, "-O", "raw", "bs=512", "count=1",
                f"if={info.path}", f"of={out}"]  # fmt: skip
        proc = _run_tool(argv, f"qemu-img dd {info.path}")
        if proc.returncode != 0:
            raise _unusable(info.path, proc.stderr)
        return out.read_bytes()


# -- the overlay --------------------------------------------------------------------------


def make_overlay(base: ImageInfo, run_dir: Path) -> Path:
    """A qcow2 in ``run_dir`` whose reads fall through to ``base`` and whose writes stay
    in it. The backing format is recorded in the overlay, so a raw base is never probed."""
    overlay = run_dir / OVERLAY_NAME
    argv = [_tool("qemu-img"), "create", "-q", "-f", "qcow2", "-F", base.format,
            "-b", str(base.path), str(overlay)]  # fmt: skip
    proc = _run_tool(argv, f"qemu-img create {overlay}")
    if proc.returncode != 0:
        overlay.unlink(missing_ok=True)
        reason = _first_line(proc.stderr).removeprefix("qemu-img: ")
        raise RuntimeFailure(f"cannot make the overlay for {base.path}: {reason}")
    overlay.chmod(0o600)
    return overlay


# -- the NoCloud seed ---------------------------------------------------------------------


def guest_hostname(name: str) -> str:
    """A VM name as a hostname: hpcvm names may hold ``_``, hostnames may not."""
    return name.replace("_", "-")


def meta_data(name: str, instance_id: str) -> str:
    """NoCloud meta-data. A new instance-id per VM makes cloud-init treat each boot of
    the image as a new instance and run the seed's per-instance steps again. Values are
    JSON strings (valid YAML) so that a name like ``1e3`` stays a string."""
    return (
        f"instance-id: {json.dumps(instance_id)}\n"
        f"local-hostname: {json.dumps(guest_hostname(name))}\n"
    )


def _agent_script(port: str) -> str:
    """Shell run by cloud-init's bootcmd: start qemu-ga on ``port`` unless it runs.

    The port is found through sysfs (``/sys/class/virtio-ports/*/name``) and opened as
    its ``/dev/vportNpM`` node, which the kernel makes without udev. ``--no-block``:
    bootcmd runs inside cloud-init.service, which sysinit.target waits for, and a
    service (default dependencies) starts only after sysinit, so waiting would deadlock.
    """
    return (
        f"for f in /sys/class/virtio-ports/*/name; do\n"
        f'  [ "$(cat "$f" 2>/dev/null)" = {port} ] || continue\n'
        f"  ga=$(command -v qemu-ga) || {{ echo 'hpcvm: qemu-ga not found: install "
        f"qemu-guest-agent in this image' >&2; exit 1; }}\n"
        f"  systemctl is-active --quiet {AGENT_UNIT} ||\n"
        f"    systemd-run --no-block --unit={AGENT_UNIT} -p Restart=always -p RestartSec=1 \\\n"
        f'      "$ga" --method=virtio-serial --path="/dev/$(basename "$(dirname "$f")")"\n'
        f"done\n"
    )


def user_data(name: str, agent_port: str = DISK_AGENT_PORT) -> str:
    """NoCloud user-data: make sure qemu-guest-agent runs on ``agent_port``; install
    nothing. ``bootcmd`` runs early on every boot (a transient unit does not survive a
    reboot). A login prompt on the serial console (the run dir's console log) helps
    when debugging a guest."""
    if not _PORT_RE.match(agent_port):
        raise UsageError(
            f"invalid virtio-serial port name {agent_port!r}: use letters, digits, . _ -"
        )
    script = "".join(f"      {line}\n" for line in _agent_script(agent_port).splitlines())
    return (
        "#cloud-config\n"
        f"# Written by hpcvm for VM {name}: hpcvm runs commands in the guest and checks it\n"
        f"# through qemu-guest-agent on the virtio-serial port {agent_port}.\n"
        "# Nothing is installed: the guest has no network.\n"
        "package_update: false\n"
        "package_upgrade: false\n"
        "bootcmd:\n"
        "  - - sh\n"
        "    - -c\n"
        "    - |\n"
        f"{script}"
        "runcmd:\n"
        "  - [systemctl, enable, --now, serial-getty@ttyS0.service]\n"
    )


def make_seed(
    run_dir: Path,
    *,
    name: str,
    instance_id: str | None = None,
    agent_port: str = DISK_AGENT_PORT,
) -> Path:
    """Write the NoCloud seed (ISO9660 with Joliet and Rock Ridge, volume ``cidata``)
    into ``run_dir``; the staging files are removed, the seed is 0600."""
    iid = instance_id or f"hpcvm-{name}-{uuid.uuid4().hex[:12]}"
    seed = run_dir / SEED_NAME
    tmp = run_dir / f".{SEED_NAME}.tmp"
    with tempfile.TemporaryDirectory(prefix=".seed.", dir=run_dir) as staging:
        files = {"meta-data": meta_data(name, iid), "user-data": user_data(name, agent_port)}
        for file_name, text in files.items():
            (Path(staging) / file_name).write_text(text)
        argv = [_tool("genisoimage"), "-quiet", "-output", str(tmp), "-volid", SEED_LABEL,
                "-joliet", "-rock", *(str(Path(staging) / f) for f in files)]  # fmt: skip
        proc = _run_tool(argv, "genisoimage")
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeFailure(f"genisoimage could not make the seed: {_first_line(proc.stderr)}")
    tmp.chmod(0o600)
    os.replace(tmp, seed)
    return seed


# -- both ---------------------------------------------------------------------------------


def disk_boot(image: str | Path, run_dir: Path, *, name: str) -> DiskBoot:
    """Check ``image`` and make the VM's overlay and seed in ``run_dir``.

    Raises UsageError for a bad image, RuntimeFailure if a tool fails; nothing it made
    is left behind on failure.
    """
    base = check_image(image)
    overlay = make_overlay(base, run_dir)
    try:
        seed = make_seed(run_dir, name=name)
    except BaseException:
        overlay.unlink(missing_ok=True)
        raise
    return DiskBoot(disk_image=overlay, seed_image=seed, base=base)
