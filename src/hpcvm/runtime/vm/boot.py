"""What a VM boots: the built-in guest, a user's kernel and initrd, or a disk image;
what of the host it sees (runtime/hostside/shares.py) and who its QEMU runs as
(runtime/hostside/confine.py).

Checked before anything starts: a missing kernel, initrd or image, or a bad
``--share``, is a usage error, not a QEMU that dies later with a less helpful message.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from hpcvm.bootspec import BootSpec
from hpcvm.errors import UsageError
from hpcvm.runtime.hostside import shares as sharing
from hpcvm.runtime.hostside.confine import QemuUser


@dataclass(frozen=True)
class BootMedia:
    boot: BootSpec  # boot media only; the runtime adds sockets and logs
    label: str  # Machine.image: "builtin:<kernel version>", a kernel path, or the disk
    kernel: str | None  # the kernel a KVM probe can boot, when there is one
    disk: str | None = None  # a user's disk image: overlay and seed go in the run dir
    ready_timeouts: Mapping[str, float] | None = None  # per accel; None: the runtime's
    # How the media become files in the run dir when not as ``disk`` says (a restore
    # copies a checkpoint's disk there, runtime/checkpoint/save_restore.py): (run dir, the boot spec
    # so far, NICs and shares added) -> boot spec.
    into_run_dir: Callable[[Path, BootSpec], BootSpec] | None = None


def in_run_dir(media: BootMedia, run_dir: Path, name: str) -> BootSpec:
    """The boot spec once the VM's run dir exists: a disk image boots through a qcow2
    overlay and a NoCloud seed made there (guest/disk.py), so ``down`` removes both."""
    if media.into_run_dir is not None:
        return media.into_run_dir(run_dir, media.boot)
    if media.disk is None:
        return media.boot
    from hpcvm.guest.disk import disk_boot

    made = disk_boot(media.disk, run_dir, name=name)
    return media.boot.model_copy(
        update={"disk_image": str(made.disk_image), "seed_image": str(made.seed_image)}
    )


def _existing(path: str, what: str, flag: str) -> str:
    """``path`` resolved, if it is a file; a UsageError naming ``flag`` otherwise. A path
    under a directory this user may not enter is said as such, not as a missing file
    (``Path.is_file`` raises PermissionError there on Python 3.11)."""
    p = Path(path)
    try:
        is_file = stat.S_ISREG(p.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_file = False
    except OSError as exc:
        raise UsageError(
            f"{what} {path} cannot be reached ({os.strerror(exc.errno or 0)}): give {flag} "
            "a file you may read"
        ) from None
    if not is_file:
        raise UsageError(f"{what} {path} does not exist or is not a file: check {flag}")
    return str(p.resolve())


def resolve_boot_media(
    *, kernel: str | None = None, initrd: str | None = None, image: str | None = None
) -> BootMedia:
    """Boot media for ``up``; builds the built-in guest when nothing is given."""
    if image is not None:
        if kernel is not None or initrd is not None:
            raise UsageError("give either --image or --kernel/--initrd, not both")
        return _image_media(image)
    if initrd is not None and kernel is None:
        raise UsageError("--initrd needs --kernel")
    if kernel is not None:
        kernel = _existing(kernel, "kernel", "--kernel")
        if initrd is not None:
            return _own_media(kernel, _existing(initrd, "initrd", "--initrd"))
    return _builtin_media(kernel)


def _builtin_media(kernel: str | None) -> BootMedia:
    """The built-in guest (host root over 9p, agent on virtio-serial), built for the
    distribution's kernel or for ``kernel`` (modules beside it or in /lib/modules)."""
    from hpcvm.guest import ensure_guest

    image = ensure_guest(kernel=Path(kernel) if kernel else None)
    label = f"builtin:{image.kernel_version}" if kernel is None else kernel
    return BootMedia(boot=image.boot_spec(), label=label, kernel=str(image.kernel))


def _own_media(kernel: str, initrd: str) -> BootMedia:
    """A user's kernel and initramfs, booted with the built-in guest's command line,
    shares and share table; nothing is built, so what they contain is the user's
    business."""
    from hpcvm.guest.image import CMDLINE

    boot = BootSpec(kernel=kernel, initrd=initrd, cmdline=CMDLINE, share_table=True)
    return BootMedia(boot=boot, label=kernel, kernel=kernel)


def _image_media(image: str) -> BootMedia:
    from hpcvm.guest.disk import DISK_AGENT_PORT, DISK_READY_TIMEOUT, check_image

    info = check_image(image)
    return BootMedia(
        boot=BootSpec(agent_port_name=DISK_AGENT_PORT),  # the seed starts qemu-ga on it
        label=str(info.path),
        kernel=None,
        disk=str(info.path),
        ready_timeouts=DISK_READY_TIMEOUT,
    )


def with_shares(
    media: BootMedia,
    requests: tuple[sharing.ShareRequest, ...],
    *,
    workdir: str | None,
    user: QemuUser,
    opened_by_root: bool,
    warn: sharing.Warn | None = None,
) -> BootMedia:
    """``media`` with what the guest sees: for a guest that reads the share table (the
    built-in one, a user's kernel) the built-in list (hostside/shares.py), for a disk image only
    ``requests``; each checked against what QEMU's ``user`` can reach."""
    if media.boot.share_table:
        wanted, links = sharing.builtin_requests(requests, workdir, warn)
    else:
        wanted, links = list(requests), []
    kept = sharing.reachable(wanted, user, opened_by_root=opened_by_root, warn=warn)
    listed = sharing.share_list(kept, links)
    boot = media.boot.model_copy(update={"shares": listed.shares, "links": listed.links})
    return replace(media, boot=boot)


def confined(boot: BootSpec, confines_itself: bool, user: QemuUser) -> BootSpec:
    """Without a backend that confines its QEMU itself (libvirt: its DAC label,
    qemu.conf's ``seccomp_sandbox``), QEMU drops to ``user`` (``-runas``) when hpcvm is
    root, and always runs under its seccomp sandbox."""
    if confines_itself:
        return boot
    return boot.model_copy(update={"run_as": user.name if user.switch else None, "sandbox": True})


def with_guest_kernel_args(boot: BootSpec, args: tuple[str, ...]) -> BootSpec:
    """The plan's recommended guest kernel arguments appended to the built-in guest's
    command line (a user's disk image keeps its own boot loader's)."""
    if not args or boot.cmdline is None or not boot.share_table:
        return boot
    present = set(boot.cmdline.split())
    extra = [arg for arg in args if arg not in present]
    if not extra:
        return boot
    return boot.model_copy(update={"cmdline": " ".join([boot.cmdline, *extra])})
